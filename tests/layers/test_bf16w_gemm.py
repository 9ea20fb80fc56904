"""float32 arithmetic over bf16 weights (csrc/bf16w_gemm.cpp, `--quantization
bf16_weights`) against float64 references over the same rounded weights: the kernel,
the linear layers and the LM head that take it, and the precision flags that pick it."""

from __future__ import annotations

import pytest
import torch

from radixlm.layers.cpu_gemm import bf16w_capable, bf16w_supported, pack_pairs, pairs_linear

pytestmark = pytest.mark.skipif(not bf16w_supported(), reason="no AVX2/FMA build of the kernels")


@pytest.mark.parametrize("num_cols", [16, 32, 48, 80, 96])  # 1, 2, 3, 5, 6 groups of 16
def test_bf16w_linear_matches_float64(num_cols: int) -> None:
    torch.manual_seed(0)
    weight = (torch.randn(num_cols, 96) * 0.1).to(torch.bfloat16)
    packed = pack_pairs(weight)
    bias = torch.randn(num_cols)
    x_all = torch.randn(100, 160)[:, 32:128]  # strided rows
    for rows in (1, 2, 3, 5, 6, 8, 9, 17, 33, 100):  # tiles of 5 (AVX2) or 8 rows + remainders
        x = x_all[:rows]
        for b in (None, bias):
            out = pairs_linear(x, packed, b)
            assert out.shape == (rows, num_cols) and out.dtype == torch.float32
            reference = x.double() @ weight.double().t() + (0 if b is None else b.double())
            torch.testing.assert_close(out.double(), reference, rtol=1e-5, atol=1e-5)
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


def test_linear_layers_and_the_lm_head_take_bf16_weights() -> None:
    from radixlm.layers.linear import ColumnParallelLinear, RowParallelLinear
    from radixlm.layers.vocab_embedding import ParallelLMHead

    torch.manual_seed(0)
    layer = ColumnParallelLinear(64, 96, bias=True, params_dtype=torch.float32)
    with torch.no_grad():
        layer.weight.normal_(0, 0.1)
        assert layer.bias is not None
        layer.bias.normal_()
    rounded = layer.weight.detach().to(torch.bfloat16).double()
    assert layer.prepare_weights("bf16_weights") == "packed"
    assert layer._pairs is not None and layer._pairs.dtype == torch.bfloat16
    assert layer._packed is None and layer.weight.numel() == 0  # the float32 weight is gone
    x = torch.randn(7, 64)
    torch.testing.assert_close(layer(x).double(), x.double() @ rounded.t() + layer.bias.double(),
                               rtol=1e-5, atol=1e-5)

    odd = RowParallelLinear(64, 40, bias=False, params_dtype=torch.float32)  # N % 16 != 0
    assert not bf16w_capable(odd.weight)
    odd.prepare_weights("bf16_weights")
    assert odd._pairs is None  # float32 as loaded (oneDNN-packed where it can be)

    head = ParallelLMHead(256, 64, params_dtype=torch.float32)
    with torch.no_grad():
        head.weight.normal_()
    dense = head.weight.detach().clone()
    assert head.prepare_weights("bf16_weights") == "packed"
    assert torch.equal(head.weight, dense)  # a tied embedding keeps its float32 rows
    logits = head.compute_logits(x)
    reference = x.double() @ dense.to(torch.bfloat16).double().t()
    torch.testing.assert_close(logits.double(), reference, rtol=1e-5, atol=1e-4)


def test_precision_flags_for_bf16_weights() -> None:
    from radixlm.model_executor.precision import resolve_precision

    chosen = resolve_precision("float32", "bf16_weights", "cpu")
    assert (chosen.dtype, chosen.quantization) == (torch.float32, "bf16_weights")
    assert "bfloat16 linear weights, float32 activations" in chosen.describe()
    exact = resolve_precision("float32", "auto", "cpu")  # an explicit dtype: no quantization
    assert (exact.dtype, exact.quantization) == (torch.float32, "none")
    with pytest.raises(ValueError, match="needs --dtype float32"):
        resolve_precision("bfloat16", "bf16_weights", "cpu")
    with pytest.raises(ValueError, match="for the CPU"):
        resolve_precision("float32", "bf16_weights", "cuda")
