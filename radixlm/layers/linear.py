"""Linear layers laid out for tensor parallelism (Megatron style).

- `ColumnParallelLinear` splits the output features over `tp_size` ranks;
  `MergedColumnParallelLinear` and `QKVParallelLinear` fuse several such
  projections (gate/up, q/k/v) into one matmul.
- `RowParallelLinear` splits the input features; each rank's partial sums are
  all-reduced before the bias is added.

Each parameter carries a `weight_loader(param, loaded_weight[, shard_id])`
that takes the full Hugging Face tensor and copies this rank's part into the
right rows (or columns): loading stays keyed by Hugging Face names while the
model runs fused projections. With `tp_size == 1` (today's default) nothing is
split and no collective runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.layers.prepared_weight import PreparedWeight, prepare_weight

WeightLoader = Callable[..., None]


def default_weight_loader(param: torch.Tensor, loaded_weight: Any) -> None:
    """Copy a whole tensor into a parameter (or a view of one) of the same shape, casting
    dtype and device. Bumps the parameter's version counter, so caches derived from it refresh.

    `loaded_weight` is a tensor or a model_loader.loader.LazyWeight (read here, whole)."""
    if not isinstance(loaded_weight, torch.Tensor):
        loaded_weight = loaded_weight.materialize()
    if param.shape != loaded_weight.shape:
        raise ValueError(
            f"shape mismatch: parameter {tuple(param.shape)}, checkpoint {tuple(loaded_weight.shape)}"
        )
    with torch.no_grad():
        param.copy_(loaded_weight)


def get_weight_loader(param: torch.Tensor) -> WeightLoader:
    """The parameter's own loader, or `default_weight_loader`."""
    loader: WeightLoader = getattr(param, "weight_loader", default_weight_loader)
    return loader


def _param(*shape: int, dtype: torch.dtype | None, loader: WeightLoader) -> nn.Parameter:
    # NOTE: uninitialized on purpose: every weight is overwritten by load_weights().
    p = nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)
    p.weight_loader = loader  # type: ignore[attr-defined]
    return p


def _divide(n: int, d: int) -> int:
    if n % d:
        raise ValueError(f"{n} is not divisible by tp_size {d}")
    return n // d


class _LinearBase(nn.Module):
    """y = x W^T + b with W [output_size_per_partition, input_size_per_partition]."""

    def __init__(
        self,
        input_size_per_partition: int,
        output_size_per_partition: int,
        bias: bool,
        params_dtype: torch.dtype | None,
        tp_rank: int,
        tp_size: int,
    ) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.input_size_per_partition = input_size_per_partition
        self.output_size_per_partition = output_size_per_partition
        self.weight = _param(
            output_size_per_partition,
            input_size_per_partition,
            dtype=params_dtype,
            loader=self.weight_loader,
        )
        self.bias: nn.Parameter | None = None
        if bias:
            self.bias = _param(
                output_size_per_partition, dtype=params_dtype, loader=self.weight_loader
            )

        # After prepare_weights(): the weight in its kernel's layout (prepared_weight.py).
        self.prepared: PreparedWeight | None = None

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, *args: Any) -> None:
        raise NotImplementedError

    def prepare_weights(self, quantization: str, keep_plain: bool = False) -> str:
        """After loading: put the weight in its kernel's layout (prepared_weight.prepare_weight:
        int8 for "w8a8_int8", bf16 pairs, oneDNN-packed, or as it is); keep_plain: keep the
        plain weight too where the small-batch kernel can run it. Returns "int8",
        "packed", "quantized" or "dense".

        NOTE: the dense weight is released, so weights cannot be reloaded afterwards.
        """
        if self.prepared is None:
            self.prepared = prepare_weight(self.weight, quantization, keep_plain)
        if self.prepared.category != "dense":
            self.weight.data = torch.empty(0, dtype=self.weight.dtype, device=self.weight.device)
        return self.prepared.category

    def _matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.prepared is not None:
            return self.prepared.apply(x, bias)  # [T, output_size_per_partition]
        return F.linear(x, self.weight, bias)  # [T, output_size_per_partition]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._matmul(x, self.bias)  # [T, output_size_per_partition]


class ColumnParallelLinear(_LinearBase):
    """Output features split over ranks; the output stays split (no gather)."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        params_dtype: torch.dtype | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        super().__init__(
            input_size, _divide(output_size, tp_size), bias, params_dtype, tp_rank, tp_size
        )

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, *args: Any) -> None:
        size = self.output_size_per_partition
        default_weight_loader(param, loaded_weight.narrow(0, self.tp_rank * size, size))


class MergedColumnParallelLinear(_LinearBase):
    """Several column-parallel projections of one input fused into one matmul.

    Shard `i` (e.g. 0 = gate_proj, 1 = up_proj) occupies rows
    `sum(output_sizes[:i]) / tp_size` onwards of this rank's weight.
    """

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        bias: bool = False,
        params_dtype: torch.dtype | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        self.output_sizes = [_divide(n, tp_size) for n in output_sizes]
        super().__init__(input_size, sum(self.output_sizes), bias, params_dtype, tp_rank, tp_size)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, *args: Any) -> None:
        (shard_id,) = args
        size = self.output_sizes[shard_id]
        offset = sum(self.output_sizes[:shard_id])
        src = loaded_weight.narrow(0, self.tp_rank * size, size)
        default_weight_loader(param.narrow(0, offset, size), src)

    def load_fused_weight(self, param: nn.Parameter, loaded_weight: Any) -> None:
        """A checkpoint that stores the projections fused (Phi-3's gate_up_proj): the
        whole tensor, shard after shard, each split over the ranks."""
        offset = 0
        for shard_id, size in enumerate(self.output_sizes):
            full = size * self.tp_size
            self.weight_loader(param, loaded_weight.narrow(0, offset, full), shard_id)
            offset += full


class QKVParallelLinear(_LinearBase):
    """q, k and v projections fused: this rank's rows are [q heads | k heads | v heads].

    With more ranks than KV heads, each KV head is replicated on
    `tp_size / num_kv_heads` ranks.
    """

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool = False,
        params_dtype: torch.dtype | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        self.head_dim = head_dim
        self.num_heads = _divide(num_heads, tp_size)
        if tp_size >= num_kv_heads:
            self.num_kv_heads, self.kv_replicas = 1, _divide(tp_size, num_kv_heads)
        else:
            self.num_kv_heads, self.kv_replicas = _divide(num_kv_heads, tp_size), 1
        out = (self.num_heads + 2 * self.num_kv_heads) * head_dim
        super().__init__(hidden_size, out, bias, params_dtype, tp_rank, tp_size)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    def load_fused_weight(self, param: nn.Parameter, loaded_weight: Any) -> None:
        """A checkpoint that stores q, k and v fused (Phi-3's qkv_proj): the whole
        tensor, [all q heads | all k heads | all v heads] rows."""
        q_full = self.num_heads * self.tp_size * self.head_dim
        kv_full = self.num_kv_heads * self.tp_size // self.kv_replicas * self.head_dim
        for shard_id, offset, size in (("q", 0, q_full), ("k", q_full, kv_full),
                                       ("v", q_full + kv_full, kv_full)):
            self.weight_loader(param, loaded_weight.narrow(0, offset, size), shard_id)

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, *args: Any) -> None:
        (shard_id,) = args
        if shard_id == "q":
            offset, size, src_rank = 0, self.q_size, self.tp_rank
        elif shard_id == "k":
            offset, size, src_rank = self.q_size, self.kv_size, self.tp_rank // self.kv_replicas
        elif shard_id == "v":
            offset, size = self.q_size + self.kv_size, self.kv_size
            src_rank = self.tp_rank // self.kv_replicas
        else:
            raise ValueError(f"unknown qkv shard {shard_id!r}")
        src = loaded_weight.narrow(0, src_rank * size, size)
        default_weight_loader(param.narrow(0, offset, size), src)


class RowParallelLinear(_LinearBase):
    """Input features split over ranks; partial outputs are summed over ranks, then biased."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        params_dtype: torch.dtype | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        reduce_results: bool = True,
    ) -> None:
        super().__init__(
            _divide(input_size, tp_size), output_size, bias, params_dtype, tp_rank, tp_size
        )
        self.reduce_results = reduce_results

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, *args: Any) -> None:
        if param.dim() == 1:  # the bias is not split
            default_weight_loader(param, loaded_weight)
            return
        size = self.input_size_per_partition
        default_weight_loader(param, loaded_weight.narrow(1, self.tp_rank * size, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self._matmul(x, self.bias)  # [T, output_size]
        out = self._matmul(x, None)  # [T, output_size], this rank's partial sum
        if self.reduce_results:
            torch.distributed.all_reduce(out)
        return out if self.bias is None else out + self.bias
