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
