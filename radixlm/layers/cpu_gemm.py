"""Prepacked float32 matmuls on the CPU through oneDNN.

MKL's default sgemm is slow for the shapes decoding produces (a few to a few
dozen rows against a large weight): on the 2-core AVX2 machines here a
oneDNN weight reordered once (`mkldnn._reorder_linear_weight`) runs the
SmolLM2 MLP up to 1.8x and the 49k-row output layer up to 2.5x faster than
`F.linear`, at every batch size. Packing replaces the dense weight, so it is
done once, after loading (`prepack_model`), and only for float32 on the CPU.
Results equal `F.linear` up to float32 summation order (~1e-5 relative).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)

# Batch size the packed layout is tuned for; any batch size works.
_PACK_BATCH_HINT = 64


def onednn_available() -> bool:
    return bool(
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def can_pack(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.dim() == 2


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] → an opaque oneDNN tensor for `packed_linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), _PACK_BATCH_HINT)


def packed_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [M, K] → x W^T + b, [M, N]."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def prepack_model(model: nn.Module) -> int:
    """Call `prepack()` on every module that has one; return how many packed."""
    if not onednn_available():
        logger.info("oneDNN is unavailable: linear layers use F.linear")
        return 0
    num_packed = 0
    for module in model.modules():
        prepack = getattr(module, "prepack", None)
        if callable(prepack) and prepack():
            num_packed += 1
    return num_packed
