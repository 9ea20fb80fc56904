"""How the KV pool stores K and V: `--kv-cache-dtype auto | int8 | fp8_e4m3 | fp8_e5m2`.

The model writes K and V in its compute dtype (`KVFormat.dtype`) and attention reads
them back in it; the pool stores each (slot, KV head) row as:

- auto: the compute dtype itself (float32, bfloat16 or float16), head_dim elements;
- int8: head_dim int8 values then the row's float32 scale (4 bytes, native byte order),
  head_dim + 4 int8 elements: symmetric, scale = max |x| / 127, q = round(x / scale)
  (half to even), x ≈ q * scale. One scale per token and head, written with the row
  (docs/kv-cache.md says why not one per block of 32 values);
- fp8_e4m3, fp8_e5m2: torch.float8_e4m3fn / float8_e5m2, head_dim elements, no
  scale (SGLang's and vLLM's default k_scale = v_scale = 1): values beyond the
  format's range are clamped to it, then rounded to nearest even.

Quantizing happens when K/V are written into the pool (`store_rows`, the C++
`kv_store` kernel does the same bit for bit); the C++ paged attention kernels read
the stored rows directly and convert them in registers; the torch-native backend
converts what it gathers (`gather_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KV_CACHE_DTYPES = ("auto", "int8", "fp8_e4m3", "fp8_e5m2")

INT8_SCALE_BYTES = 4  # one float32 scale after each int8 row
_INT8_MAX = 127.0
_FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


@dataclass(frozen=True)
class KVFormat:
    """One KV pool's storage: its name as the user gives it, the compute dtype, the
    buffers' element dtype and the width of a (slot, head) row in those elements."""

    name: str  # "auto" resolved to the compute dtype's name, e.g. "bfloat16"; or int8, fp8_*
    dtype: torch.dtype  # K/V as written and read back
    storage: torch.dtype  # the buffers' element dtype
    head_dim: int
    row_width: int  # storage elements of one (slot, head) row

    @property
    def quantized(self) -> bool:
        return self.storage != self.dtype

    def row_bytes(self) -> int:
        return self.row_width * _element_size(self.storage)

    def bytes_per_token(self, num_layers: int, num_kv_heads: int) -> int:
        """K plus V of one slot over all layers, scales included."""
        return 2 * num_layers * num_kv_heads * self.row_bytes()


def kv_format(kv_cache_dtype: str, dtype: torch.dtype, head_dim: int) -> KVFormat:
    """The format `--kv-cache-dtype kv_cache_dtype` gives a model computing in `dtype`."""
    if kv_cache_dtype == "auto":
        return KVFormat(_dtype_name(dtype), dtype, dtype, head_dim, head_dim)
    if kv_cache_dtype == "int8":
        return KVFormat("int8", dtype, torch.int8, head_dim, head_dim + INT8_SCALE_BYTES)
    if kv_cache_dtype in _FP8:
        return KVFormat(kv_cache_dtype, dtype, _FP8[kv_cache_dtype], head_dim, head_dim)
    raise ValueError(f"unknown KV cache dtype {kv_cache_dtype!r}; choose one of "
                     f"{', '.join(KV_CACHE_DTYPES)}")


def quantize_rows(x: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """x [..., head_dim] (any float dtype) → its stored rows [..., row_width]."""
    if not fmt.quantized:
        return x.to(fmt.dtype)
    xf = x.float()
    if fmt.storage == torch.int8:
        scale = xf.abs().amax(-1, keepdim=True) / _INT8_MAX  # [..., 1]
        q = torch.where(scale > 0, xf / scale, 0.0).round_().clamp_(-_INT8_MAX, _INT8_MAX)
        return torch.cat([q.to(torch.int8), scale.view(torch.int8)], dim=-1)
    limit = torch.finfo(fmt.storage).max
    return xf.clamp(-limit, limit).to(fmt.storage)


def dequantize_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Stored rows [..., row_width] → values [..., head_dim] in `dtype`. The format is
    known from the rows' dtype (int8 rows always carry their scale)."""
    if rows.dtype != torch.int8:
        return rows.to(dtype)
    head_dim = rows.shape[-1] - INT8_SCALE_BYTES
    scale = rows[..., head_dim:].contiguous().view(torch.float32)  # [..., 1]
    return (rows[..., :head_dim].float() * scale).to(dtype)


def gather_rows(buf: torch.Tensor, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """buf [slots, Hkv, row_width] at slots `index` [N] → [N, Hkv, head_dim] in `dtype`."""
    # NOTE: index_select, not buf[index]: an order of magnitude faster on the CPU.
    return dequantize_rows(buf.index_select(0, index), dtype)


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
