"""SmolLM3: the Llama decoder whose every fourth layer has no rotary (NoPE).

`no_rope_layers[i]` is 1 where layer i rotates q and k and 0 where it does not
(transformers' naming); sliding windows follow `layer_types` when
`use_sliding_window` is set.
"""

from __future__ import annotations

from typing import Any

from radixlm.layers.attention import AttnOptions
from radixlm.models.decoder import DEFAULT_ROPE, LayerSpec, sliding_windows
from radixlm.models.llama import LlamaForCausalLM


class SmolLM3ForCausalLM(LlamaForCausalLM):
    @classmethod
    def layer_specs(cls, config: Any) -> list[LayerSpec]:
        uses_rope = list(config.no_rope_layers)
        return [LayerSpec(AttnOptions(sliding_window=window),
                          rope=DEFAULT_ROPE if uses_rope[i] else None)
                for i, window in enumerate(sliding_windows(config))]
