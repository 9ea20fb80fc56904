"""Gated activations."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.layers.cpu_kernels import use_fused_cpu_kernel


class SiluAndMul(nn.Module):
    """`silu(gate) * up` for x = [gate | up] of shape [T, 2 * d]; returns [T, d]."""

    fuse_float32 = False  # float32 through the fused kernel too (bf16_weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and use_fused_cpu_kernel(x, self.fuse_float32):
            return torch.ops.radixlm.silu_and_mul(x)  # [T, d], one pass
        gate, up = x.chunk(2, dim=-1)  # each [T, d]
        return F.silu(gate) * up


class GeluTanhAndMul(nn.Module):
    """`gelu_tanh(gate) * up` for x = [gate | up] of shape [T, 2 * d]; returns [T, d]
    (Gemma's `gelu_pytorch_tanh`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)  # each [T, d]
        return F.gelu(gate, approximate="tanh") * up


def gated_activation(name: str) -> nn.Module:
    """The gated activation for a config's `hidden_act` / `hidden_activation`."""
    if name == "silu":
        return SiluAndMul()
    if name in ("gelu_pytorch_tanh", "gelu_tanh"):
        return GeluTanhAndMul()
    raise NotImplementedError(f"hidden activation {name!r} is not supported")
