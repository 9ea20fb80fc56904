"""Gemma 3 (text): `Gemma3ForCausalLM`, as Gemma 3 1B ships.

Over the shared decoder blocks, Gemma 3 declares: (1 + w) RMSNorm everywhere
(GemmaRMSNorm), per-head q/k norms, a norm after attention and a pair around
the MLP ("sandwich" norms), a GELU-tanh MLP, embeddings scaled by
sqrt(hidden_size), the softmax scale `query_pre_attn_scalar ** -0.5`,
interleaved sliding-window and global layers (`layer_types`: five sliding to
one global) whose rotary tables have their own bases (`rope_parameters` per
layer type: 10k local, 1M global, the global one with its scaling), and the
final logit softcap.

NOTE: Gemma 3 configs carry `attn_logit_softcapping` (null in Google's), but
Gemma 3 does not softcap its attention: transformers' Gemma3Attention never
passes it on and llama.cpp's converter asserts it is absent. So a value there
is ignored, with a warning; the attention backends implement the softcap
(`AttnOptions.logit_softcap`) for the families that use it (Gemma 2's kind).
"""

from __future__ import annotations

import logging
from typing import Any

from radixlm.layers.attention import AttnOptions
from radixlm.layers.layernorm import GemmaRMSNorm
from radixlm.models.decoder import (
    Biases,
    DecoderArch,
    DecoderForCausalLM,
    LayerSpec,
    sliding_windows,
)

logger = logging.getLogger(__name__)


class Gemma3ForCausalLM(DecoderForCausalLM):
    @classmethod
    def arch(cls, config: Any) -> DecoderArch:
        if getattr(config, "use_bidirectional_attention", False):
            raise NotImplementedError("Gemma 3 with bidirectional attention is not a causal LM")
        bias = bool(getattr(config, "attention_bias", False))
        cap = getattr(config, "final_logit_softcapping", None)
        return DecoderArch(biases=Biases(qkv=bias, o=bias), qk_norm=True, norm=GemmaRMSNorm,
                           sandwich_norms=True,
                           activation=getattr(config, "hidden_activation", "gelu_pytorch_tanh"),
                           embed_scale=True, final_logit_softcap=float(cap) if cap else None)

    @classmethod
    def layer_specs(cls, config: Any) -> list[LayerSpec]:
        scale = float(config.query_pre_attn_scalar) ** -0.5
        if getattr(config, "attn_logit_softcapping", None):
            logger.warning("Gemma 3 ignores attn_logit_softcapping=%s (as transformers does)",
                           config.attn_logit_softcapping)
        return [LayerSpec(AttnOptions(scale=scale, sliding_window=window), rope=layer_type)
                for window, layer_type in zip(sliding_windows(config), config.layer_types)]
