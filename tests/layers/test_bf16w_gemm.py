"""float32 arithmetic over bf16 weights (csrc/bf16w_gemm.cpp, `--quantization
bf16_weights`) against float64 references over the same rounded weights: the linear
layers and the LM head that take it, and the precision flags that pick it (the kernel
itself: test_pairs_kernels.py)."""

from __future__ import annotations

import pytest
import torch
from _kernels import requires_bf16w

from radixlm.layers.cpu_gemm import bf16w_capable
from radixlm.layers.prepared_weight import PairsWeight

pytestmark = requires_bf16w()


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
    assert isinstance(layer.prepared, PairsWeight) and layer.prepared.packed.dtype == torch.bfloat16
    assert layer.prepared.kernel == "bf16w_linear"
    assert layer.weight.numel() == 0  # the float32 weight is gone
    x = torch.randn(7, 64)
    torch.testing.assert_close(layer(x).double(), x.double() @ rounded.t() + layer.bias.double(),
                               rtol=1e-5, atol=1e-5)

    odd = RowParallelLinear(64, 40, bias=False, params_dtype=torch.float32)  # N % 16 != 0
    assert not bf16w_capable(odd.weight)
    odd.prepare_weights("bf16_weights")
    assert not isinstance(odd.prepared, PairsWeight)  # float32 as loaded (oneDNN where it can be)

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
