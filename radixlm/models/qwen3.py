"""Qwen3 and Qwen3-MoE.

Qwen3 is the Llama decoder with an RMSNorm over each head of q and k before
the rotary (`q_norm`, `k_norm`, weights of head_dim). Qwen3-MoE replaces the
MLP of its sparse layers (every `decoder_sparse_step`-th, except
`mlp_only_layers`) by a top-k mixture of experts (models/moe.py). Sliding
windows follow the config's `layer_types` (`use_sliding_window`), as in
transformers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from radixlm.layers.attention import AttnOptions
from radixlm.models.decoder import (
    Biases,
    DecoderArch,
    DecoderForCausalLM,
    GatedMLP,
    LayerSpec,
    sliding_windows,
)
from radixlm.models.moe import SparseMoeBlock


class Qwen3ForCausalLM(DecoderForCausalLM):
    @classmethod
    def arch(cls, config: Any) -> DecoderArch:
        bias = bool(getattr(config, "attention_bias", False))
        return DecoderArch(biases=Biases(qkv=bias, o=bias), qk_norm=True,
                           activation=getattr(config, "hidden_act", "silu"))


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    @classmethod
    def layer_specs(cls, config: Any) -> list[LayerSpec]:
        dense = set(getattr(config, "mlp_only_layers", None) or [])
        step = int(getattr(config, "decoder_sparse_step", 1) or 1)
        return [LayerSpec(AttnOptions(sliding_window=w),
                          sparse_mlp=(i not in dense and int(config.num_experts) > 0
                                      and (i + 1) % step == 0))
                for i, w in enumerate(sliding_windows(config))]

    def make_mlp(self, config: Any, layer_id: int, spec: LayerSpec, dtype: torch.dtype,
                 arch: DecoderArch) -> nn.Module:
        if spec.sparse_mlp:
            return SparseMoeBlock(config, dtype, arch.activation)
        return GatedMLP(config.hidden_size, config.intermediate_size, dtype, arch.activation)
