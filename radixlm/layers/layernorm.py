"""RMSNorm, with the residual add fused in front of it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.layers.cpu_kernels import use_fused_cpu_kernel


class RMSNorm(nn.Module):
    """`weight * x / sqrt(mean(x^2) + eps)` over the last dimension (Hugging Face name: weight)."""

    fuse_float32 = False  # float32 residual adds through the fused kernel (bf16_weights)

    def __init__(self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype | None = None):
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (self.hidden_size,), self.weight, self.eps)  # [T, hidden]

    def add_and_norm(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`(norm(x + residual), x + residual)`: the pre-norm block's residual stream."""
        if (x.dim() == 2 and use_fused_cpu_kernel(x, self.fuse_float32) and residual.dtype == x.dtype
                and self.weight.dtype == x.dtype):
            normed, summed = torch.ops.radixlm.add_rms_norm(
                x, residual.contiguous(), self.weight, self.eps)
            return normed, summed  # each [T, hidden]
        residual = x + residual  # [T, hidden]
        return self.forward(residual), residual


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm, `(1 + weight) * x / sqrt(mean(x^2) + eps)` (Hugging Face name: weight).

    The checkpoint's weight is loaded as `1 + weight`, so the forward and the fused
    add-and-norm are RMSNorm's. In float32 this is Gemma's arithmetic; in bfloat16 the
    stored `1 + weight` is rounded once (transformers keeps it in float32).
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype | None = None):
        super().__init__(hidden_size, eps, dtype)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]

    @staticmethod
    def weight_loader(param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        if not isinstance(loaded_weight, torch.Tensor):  # a LazyWeight
            loaded_weight = loaded_weight.materialize()
        if param.shape != loaded_weight.shape:
            raise ValueError(f"shape mismatch: parameter {tuple(param.shape)}, "
                             f"checkpoint {tuple(loaded_weight.shape)}")
        with torch.no_grad():
            param.copy_(1.0 + loaded_weight.float())
