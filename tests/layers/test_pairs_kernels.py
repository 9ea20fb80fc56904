"""The two kernels over bf16 pairs-packed weights (csrc/pairs_tiles.h's tile loop):
bf16 arithmetic (bf16_gemm.cpp, AVX512_BF16 CPUs) and float32 arithmetic over the bf16
weights (bf16w_gemm.cpp, `--quantization bf16_weights`, AVX2 or AVX-512F), each
against a float64 reference over the same rounded weights, on every tile shape."""

from __future__ import annotations

import pytest
import torch
from _kernels import KERNELS_MISSING, bf16w_skip_reason

from radixlm.layers.cpu_gemm import pack_pairs, pairs_capable, pairs_linear
from radixlm.layers.cpu_kernels import load_cpu_kernels


@pytest.mark.parametrize(("x_dtype", "tolerance"), [(torch.bfloat16, 1e-2), (torch.float32, 1e-5)],
                         ids=["bf16", "bf16w"])
@pytest.mark.parametrize("num_cols", [16, 32, 48, 80, 96])  # 1, 2, 3, 5, 6 groups of 16
def test_pairs_linear_matches_float64(x_dtype: torch.dtype, tolerance: float,
                                      num_cols: int, isa_level: str) -> None:
    torch.manual_seed(0)
    weight = (torch.randn(num_cols, 96) * 0.1).to(torch.bfloat16)
    if load_cpu_kernels() is None:
        pytest.skip(KERNELS_MISSING)
    if x_dtype == torch.bfloat16 and not pairs_capable(weight):
        pytest.skip(f"no AVX512_BF16 at ISA level {isa_level}")
    if x_dtype == torch.float32 and (reason := bf16w_skip_reason()) is not None:
        pytest.skip(reason)
    packed = pack_pairs(weight)
    bias = torch.randn(num_cols).to(x_dtype)
    x_all = torch.randn(100, 160).to(x_dtype)[:, 32:128]  # strided rows
    # tiles of at most 8 rows (AVX-512) or 5 (bf16w on AVX2), split evenly; no rows at
    # all (a prefill chunk asks the LM head for none)
    for rows in (0, 1, 2, 3, 5, 6, 8, 9, 16, 17, 33, 100):
        x = x_all[:rows]
        for b in (None, bias):
            out = pairs_linear(x, packed, b)
            assert out.shape == (rows, num_cols) and out.dtype == x_dtype
            reference = x.double() @ weight.double().t() + (0 if b is None else b.double())
            torch.testing.assert_close(out.double(), reference, rtol=tolerance, atol=tolerance)
    # Each row is computed the same way whatever the batch and the thread count.
    full = pairs_linear(x_all, packed, bias)
    assert torch.equal(pairs_linear(x_all[5:6], packed, bias), full[5:6])
    assert torch.equal(pairs_linear(x_all[3:40], packed, bias), full[3:40])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(pairs_linear(x_all, packed, bias), full)
    finally:
        torch.set_num_threads(threads)
