"""How the KV pool stores K and V: `--kv-cache-dtype auto | bfloat16 | int8 | fp8_e4m3 |
fp8_e5m2`.

The model writes K and V in its compute dtype (`KVFormat.dtype`) and attention reads
them back in it; the pool stores each (slot, KV head) row of head_dim values as:

- auto: the compute dtype itself (float32, bfloat16 or float16);
- bfloat16 (or bf16): head_dim bfloat16 values, rounded to nearest even: half of
  float32's bytes for a float32 model (a bf16 model's auto); on a CPU with bf16 dot
  products the flash attention of prefill chunks then runs in them (vdpbf16ps: the
  queries and probabilities rounded to bf16 too, csrc/attention_flash_body.h);
- int8: blocks of B = gcd(head_dim, 32) values (32 for the usual head dims), each
  rotated by the B-point Hadamard transform (x -> H x, H orthonormal and symmetric,
  so H H = I) and quantized with its own scale: s = fp16(max |H x| / 127),
  q = clamp(round(H x / s), -127, 127), half to even. A row is the head_dim int8
  values, then its head_dim / B float16 scales (head_dim + 2 head_dim / B bytes: 68
  for head dim 64, 136 for 128). The rotation spreads a key's outlier channels over
  its block, so one scale per block fits every value; attention needs no inverse
  per key: q . k = (H q) . (H k) and sum p v = H sum p (H v), so the kernels rotate
  each query row once and each output row once (docs/kv-cache.md#kv-cache-dtypes
  has the measurements that chose this layout);
- fp8_e4m3, fp8_e5m2: torch.float8_e4m3fn / float8_e5m2, head_dim values, no scale
  and no rotation (SGLang's and vLLM's format with k_scale = v_scale = 1): values
  beyond the format's range are clamped to it, then rounded to nearest even.

Quantizing happens when K/V are written into the pool (`quantize_rows`; the C++
`kv_store` kernel computes the same bytes: the same butterflies in the same order);
the C++ paged attention kernels read the stored rows directly and convert them in
registers; the torch-native backend converts what it gathers (`gather_rows`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

KV_CACHE_DTYPES = ("auto", "bfloat16", "int8", "fp8_e4m3", "fp8_e5m2")
_ALIASES = {"bf16": "bfloat16"}  # SGLang's other name for it

_INT8_MAX = 127.0
_MAX_BLOCK = 32
_FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def int8_block(head_dim: int) -> int:
    """Values per scale (and per Hadamard rotation) of an int8 row: gcd(head_dim, 32)."""
    return math.gcd(head_dim, _MAX_BLOCK)


def int8_row_width(head_dim: int) -> int:
    """Bytes of an int8 row: the values, then a float16 scale per block."""
    return head_dim + 2 * (head_dim // int8_block(head_dim))


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
        return self.row_width * torch.empty((), dtype=self.storage).element_size()

    def bytes_per_token(self, num_layers: int, num_kv_heads: int) -> int:
        """K plus V of one slot over all layers, scales included."""
        return 2 * num_layers * num_kv_heads * self.row_bytes()


def kv_format(kv_cache_dtype: str, dtype: torch.dtype, head_dim: int) -> KVFormat:
    """The format `--kv-cache-dtype kv_cache_dtype` gives a model computing in `dtype`."""
    kv_cache_dtype = _ALIASES.get(kv_cache_dtype, kv_cache_dtype)
    if kv_cache_dtype == "auto":
        return KVFormat(str(dtype).removeprefix("torch."), dtype, dtype, head_dim, head_dim)
    if kv_cache_dtype == "bfloat16":  # stored rounded to bf16 (as auto for a bf16 model)
        return KVFormat("bfloat16", dtype, torch.bfloat16, head_dim, head_dim)
    if kv_cache_dtype == "int8":
        return KVFormat("int8", dtype, torch.int8, head_dim, int8_row_width(head_dim))
    if kv_cache_dtype in _FP8:
        return KVFormat(kv_cache_dtype, dtype, _FP8[kv_cache_dtype], head_dim, head_dim)
    raise ValueError(f"unknown KV cache dtype {kv_cache_dtype!r}; choose one of "
                     f"{', '.join(KV_CACHE_DTYPES)}")


def hadamard_blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """x [..., n] float32 with every block of `block` values (a power of two) replaced by
    its orthonormal Hadamard transform: the butterflies of csrc/kv_store.cpp's, in the same
    order, then the same float32 factor 1/sqrt(block), so both give the same bits. The
    transform is its own inverse."""
    shape = x.shape
    y = x.reshape(-1, shape[-1] // block, block)
    h = 1
    while h < block:
        pairs = y.reshape(*y.shape[:2], block // (2 * h), 2, h)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        y = torch.stack([a + b, a - b], dim=-2).reshape(*y.shape[:2], block)
        h *= 2
    norm = torch.tensor(1.0 / math.sqrt(block), dtype=torch.float32)
    return (y * norm).reshape(shape)


def quantize_rows(x: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """x [..., head_dim] (any float dtype) → its stored rows [..., row_width]."""
    if not fmt.quantized:
        return x.to(fmt.dtype)
    xf = x.float()
    if fmt.storage == torch.int8:
        block = int8_block(fmt.head_dim)
        shape = xf.shape
        rotated = hadamard_blocks(xf, block).reshape(*shape[:-1], shape[-1] // block, block)
        scale = (rotated.abs().amax(-1, keepdim=True) / _INT8_MAX).half().float()
        q = torch.where(scale > 0, rotated / scale, 0.0).round_().clamp_(-_INT8_MAX, _INT8_MAX)
        scale_bytes = scale.half().reshape(*shape[:-1], -1).view(torch.int8)
        return torch.cat([q.to(torch.int8).reshape(shape), scale_bytes], dim=-1)
    limit = torch.finfo(fmt.storage).max
    return xf.clamp(-limit, limit).to(fmt.storage)


def dequantize_rows(rows: torch.Tensor, dtype: torch.dtype, head_dim: int) -> torch.Tensor:
    """Stored rows [..., row_width] → values [..., head_dim] in `dtype` (the format is
    known from the rows' dtype)."""
    if rows.dtype != torch.int8:
        return rows.to(dtype)
    block = int8_block(head_dim)
    lead = rows.shape[:-1]
    scale = rows[..., head_dim:].contiguous().view(torch.float16).float()  # [..., nb]
    q = rows[..., :head_dim].float().reshape(*lead, head_dim // block, block)
    rotated = (q * scale.unsqueeze(-1)).reshape(*lead, head_dim)
    return hadamard_blocks(rotated, block).to(dtype)


def gather_rows(buf: torch.Tensor, index: torch.Tensor, dtype: torch.dtype,
                head_dim: int) -> torch.Tensor:
    """buf [slots, Hkv, row_width] at slots `index` [N] → [N, Hkv, head_dim] in `dtype`."""
    # NOTE: index_select, not buf[index]: an order of magnitude faster on the CPU.
    return dequantize_rows(buf.index_select(0, index), dtype, head_dim)
