"""Linear-layer weights in the form the CPU computes fastest: packed, or int8.

The kernels that replace a dense weight once it is loaded (prepared_weight.py picks
one per layer: `prepare_model`):

- oneDNN-packed float32 or bfloat16 (`pack_weight` / `packed_linear`). MKL's
  default sgemm is slow for the shapes decoding produces (a few to a few
  dozen rows against a large weight); a weight reordered once
  (`mkldnn._reorder_linear_weight`) runs SmolLM2's MLP up to 1.8x and the
  49k-row output layer up to 2.5x faster than `F.linear`. bfloat16 is packed
  only where the CPU computes it natively (avx512_bf16 / AMX): elsewhere
  oneDNN emulates it at a small fraction of float32's speed. Results equal
  `F.linear` up to summation order.
- bf16 pairs (`pairs_capable` / `pack_pairs` / `pairs_linear`): on CPUs with
  AVX512_BF16, bfloat16 weights are packed instead for radixlm's own kernel
  (csrc/bf16_gemm.cpp), which runs the CPU's bf16 dot products with its
  accumulators in registers. Measured here on all of SmolLM2's linear layers
  against oneDNN's packed bf16: 1.8x at 1 row, 1.5x at 4, 1.7x at 8, 1.3x at 16,
  1.2x at 32, 1.15x at 64-128, 1.03x at 512-2,000. Each output row is computed
  the same way whatever the batch around it (no batch-size dependent blocking).
- bf16 weights, float32 arithmetic (`bf16w_capable`, `--quantization bf16_weights`):
  for CPUs without bf16 arithmetic (AVX2, or AVX-512F without AVX512_BF16), a
  float32 weight rounded to bfloat16 and packed as for the pairs kernel; a float32
  `x` makes `pairs_linear` run csrc/bf16w_gemm.cpp, which widens each weight to
  float32 in registers and sums in float32. Half of float32's bytes: measured on a
  2-core AVX-512F Xeon on all of SmolLM2's linear layers against oneDNN's packed
  float32, 2.3x at 1 row, ~3x at 4-8, 2.2x at 16, 1.7x at 32, even from 64 rows
  (where both are bound by the FMAs).
- W8A8 int8 (`Int8Weight`, `int8_linear`; SGLang's `w8a8_int8`): the weight
  quantized symmetrically per output channel, the activations per token
  (each row its own scale) at run time, int8 x int8 -> int32 through
  `torch._int_mm` (oneDNN), then both scales. Per-token scales keep a row's
  result independent of the other rows of its batch. The quantize/rescale
  glue runs in the C++ extension when it is built (one call per linear),
  else as torch ops.

A oneDNN-packed bfloat16/half weight also keeps its plain copy (`wants_plain_copy`) where the
C++ kernels are built and all such weights take at most MAX_PLAIN_COPY_BYTES: a
step of 1-2 rows (one or two streams decoding) then runs `small_batch_linear`,
which streams the plain weight at ~90% of the memory bandwidth where oneDNN's
packed kernel reached ~60% (1.45x on all of SmolLM2's linear layers at one and at
two rows; even at three, slower from four, where oneDNN's bf16 dot products win).
The output layer of a tied embedding already has its plain weight.

torch's weight-only `_weight_int8pack_mm` / `_weight_int4pack_mm_for_cpu` are
not used: measured here they run 4-100x slower than packed float32.
"""

from __future__ import annotations

import functools
import logging
from typing import NamedTuple

import torch

from radixlm.layers.cpu_kernels import load_cpu_kernels

logger = logging.getLogger(__name__)

# Batch size the packed layout is tuned for; any batch size works.
_PACK_BATCH_HINT = 64

# small_batch_linear: at most this many rows, K a multiple of SMALL_BATCH_K_STEP.
SMALL_BATCH_ROWS = 2  # at 3 rows oneDNN's packed kernel is as fast, from 4 faster
SMALL_BATCH_K_STEP = 32
# Plain copies of packed weights are kept while they take at most this much memory.
MAX_PLAIN_COPY_BYTES = 2 << 30


def onednn_available() -> bool:
    return bool(
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def cpu_has_native_bf16() -> bool:
    """True where oneDNN computes bfloat16 in hardware (avx512_bf16, AMX).

    oneDNN's own `_is_mkldnn_bf16_supported` is also true on AVX-512F CPUs without
    bf16 instructions, where it emulates them: measured on a 2-core AVX-512F Xeon
    (Ice Lake, no avx512_bf16), its packed bf16 ran all of SmolLM2's linear layers
    2.8x slower than packed float32 at 32 rows and 3x at 512. So the CPU's own
    flags decide."""
    try:
        if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return False
    except (AttributeError, RuntimeError):
        return False
    return _cpu_has_bf16_instructions()


@functools.cache
def _cpu_has_bf16_instructions() -> bool:
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:  # another torch: the kernel's view of the CPU
        try:
            with open("/proc/cpuinfo") as f:
                flags = set(f.read().split())
        except OSError:
            return False
        return bool(flags & {"avx512_bf16", "amx_bf16"})


def can_pack(weight: torch.Tensor) -> bool:
    if weight.device.type != "cpu" or weight.dim() != 2 or not onednn_available():
        return False
    return weight.dtype == torch.float32 or (
        weight.dtype == torch.bfloat16 and cpu_has_native_bf16()
    )


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] → an opaque oneDNN tensor for `packed_linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), _PACK_BATCH_HINT)


def packed_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [M, K] → x W^T + b, [M, N] (x in the weight's dtype)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def pairs_capable(weight: torch.Tensor) -> bool:
    """Whether `pack_pairs` takes this weight: bfloat16 [N, K] on the CPU, N a multiple
    of 16 and K even, the kernels built for a CPU with AVX512_BF16."""
    return (weight.device.type == "cpu" and weight.dim() == 2 and weight.dtype == torch.bfloat16
            and weight.shape[0] % 16 == 0 and weight.shape[1] % 2 == 0
            and load_cpu_kernels() is not None and bool(torch.ops.radixlm.bf16_pairs_supported()))


def bf16w_capable(weight: torch.Tensor) -> bool:
    """Whether `--quantization bf16_weights` packs this weight: float32 [N, K] on the
    CPU, N a multiple of 16 and K even, the kernels built for a CPU with AVX2 and FMA."""
    return (weight.device.type == "cpu" and weight.dim() == 2 and weight.dtype == torch.float32
            and weight.shape[0] % 16 == 0 and weight.shape[1] % 2 == 0
            and bf16w_supported())


def bf16w_supported() -> bool:
    """Whether the kernels run float32 arithmetic over bf16 weights on this CPU."""
    return load_cpu_kernels() is not None and bool(torch.ops.radixlm.bf16w_supported())


def pack_pairs(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] → [N / 16, K / 2, 32] for `pairs_linear` (see csrc/bf16_gemm.cpp)."""
    return torch.ops.radixlm.pack_bf16_pairs(weight.detach().contiguous())


def pairs_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] → x W^T + b, [M, N]: float32 for a float32 x (bf16 weights, float32
    arithmetic), else bfloat16."""
    if x.dtype == torch.float32:
        if x.stride(-1) != 1:
            x = x.contiguous()
        if bias is not None and bias.dtype != torch.float32:
            bias = bias.float()
        return torch.ops.radixlm.bf16w_linear(x, packed, bias)
    if x.dtype != torch.bfloat16 or x.stride(-1) != 1:
        x = x.to(torch.bfloat16).contiguous()
    if bias is not None and bias.dtype != torch.bfloat16:
        bias = bias.to(torch.bfloat16)
    return torch.ops.radixlm.bf16_pairs_linear(x, packed, bias)


def small_batch_capable(weight: torch.Tensor) -> bool:
    """Whether `small_batch_linear` can run this (plain) weight."""
    return (weight.device.type == "cpu" and weight.dim() == 2
            and weight.dtype in (torch.bfloat16, torch.float16)
            and weight.shape[1] % SMALL_BATCH_K_STEP == 0 and load_cpu_kernels() is not None)


def wants_plain_copy(weight: torch.Tensor) -> bool:
    """Whether this weight is packed for oneDNN (the pairs kernel does not take it) and
    `small_batch_linear` could run its plain copy: the weights prepared_weight.prepare_model may keep
    plain copies of."""
    return can_pack(weight) and not pairs_capable(weight) and small_batch_capable(weight)


def small_batch_linear(x: torch.Tensor, weight: torch.Tensor | None,
                       bias: torch.Tensor | None) -> torch.Tensor | None:
    """x [M, K] @ weight [N, K]^T + bias through the small-batch kernel, or None where it
    does not apply (no plain weight, more than SMALL_BATCH_ROWS rows, another dtype)."""
    if (weight is None or x.dim() != 2 or not 1 <= x.shape[0] <= SMALL_BATCH_ROWS
            or x.dtype != weight.dtype or weight.numel() == 0):
        return None
    return torch.ops.radixlm.small_batch_linear(x, weight, bias)  # [M, N]


class Int8Weight(NamedTuple):
    """A weight quantized per output channel: W ≈ qweight * scales[:, None]."""

    qweight: torch.Tensor  # [N, K] int8, symmetric (-127..127)
    scales: torch.Tensor  # [N] float32
    # [K] float32 or None: the input is multiplied by it before quantizing (SmoothQuant's
    # 1/s where it cannot be folded into the layer before; see smoothquant.py).
    input_scales: torch.Tensor | None = None

    @classmethod
    def quantize(cls, weight: torch.Tensor, smooth: torch.Tensor | None = None) -> Int8Weight:
        """`smooth` [K]: quantize W diag(smooth) and divide the input by it at run time."""
        w = weight.detach().float()  # [N, K]
        if smooth is not None:
            w = w * smooth.float()[None, :]
        scales = (w.abs().amax(dim=1) / 127.0).clamp_(min=1e-12)  # [N]
        qweight = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)
        input_scales = None if smooth is None else (1.0 / smooth.float()).contiguous()
        return cls(qweight.contiguous(), scales.contiguous(), input_scales)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        w = self.qweight.float() * self.scales[:, None]  # [N, K]
        if self.input_scales is not None:
            w = w * self.input_scales[None, :]
        return w.to(dtype)


def int8_linear(x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] → x W^T + b [M, N] in x's dtype, activations quantized per row."""
    if weight.input_scales is not None:
        x = x * weight.input_scales.to(x.dtype)  # [M, K]
    if x.device.type == "cpu" and load_cpu_kernels() is not None:
        return torch.ops.radixlm.int8_linear(x, weight.qweight.t(), weight.scales, bias)
    x_scales = (x.detach().abs().amax(dim=1, keepdim=True).float() / 127.0).clamp_(min=1e-12)
    xq = torch.round(x.float() / x_scales).clamp_(-127, 127).to(torch.int8)  # [M, K]
    num_rows = xq.shape[0]
    if x.device.type == "cuda" and num_rows <= 16:
        # NOTE: CUDA's _int_mm needs more than 16 rows.
        xq = torch.cat([xq, xq.new_zeros(17 - num_rows, xq.shape[1])])
    acc = torch._int_mm(xq, weight.qweight.t())[:num_rows]  # [M, N] int32
    out = acc.float() * x_scales * weight.scales
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)
