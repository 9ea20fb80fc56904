"""Phi-3 and Phi-4-mini (`Phi3ForCausalLM`).

The Llama decoder with the checkpoint's projections stored fused
(`qkv_proj`, `gate_up_proj`: loaded by splitting, decoder_weights.py), a
partial rotary (`partial_rotary_factor`: Phi-4-mini rotates 3/4 of each head)
and LongRoPE scaling (layers/rotary.py chooses the long or short factors once,
from the served context length). Sliding windows apply to every layer where
the config sets one shorter than the context (Phi-3-mini-4k's 2047;
Phi-4-mini's is longer than its context, so none).
"""

from __future__ import annotations

from typing import Any

from radixlm.models.decoder import DecoderArch, DecoderForCausalLM
from radixlm.models.llama import llama_biases


class Phi3ForCausalLM(DecoderForCausalLM):
    @classmethod
    def arch(cls, config: Any) -> DecoderArch:
        return DecoderArch(biases=llama_biases(config),
                           activation=getattr(config, "hidden_act", "silu"))
