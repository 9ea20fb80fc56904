"""The mixture-of-experts kernel (csrc/moe.cpp) against the torch loop of
models/moe.py, and what it reads.

Both route the same way, run each selected expert once over its rows and sum
the weighted outputs in float32 in ascending expert order, so they agree to
float32 rounding (the kernel may fuse a multiply-add). An expert no row
selected must never be read: a NaN in its weights would reach every output row
if it were multiplied, even by a zero weight.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _forward_harness import build_hf_model, perturb_weights
from _kernels import bf16w_skip_reason, requires_bf16w

from radixlm.layers.prepared_weight import PairsWeight, prepare_model
from radixlm.model_loader.loader import load_model

pytestmark = requires_bf16w()

MOE = dict(head_dim=16, num_hidden_layers=1, num_experts=8, num_experts_per_tok=2,
           moe_intermediate_size=32, norm_topk_prob=True)


def _moe_block(tmp_path: Any) -> Any:
    """Layer 0's SparseMoeBlock in float32 over bf16 pairs (--quantization bf16_weights)."""
    assert bf16w_skip_reason() is None
    hf = build_hf_model("qwen3_moe", **MOE)
    perturb_weights(hf, extra=("mlp.gate.weight",))  # routers away from ties
    hf.save_pretrained(tmp_path)
    model, _ = load_model(str(tmp_path), torch.float32, "cpu")
    prepare_model(model, "bf16_weights")
    block = model.model.layers[0].mlp
    assert all(isinstance(e.down_proj.prepared, PairsWeight) for e in block.experts)
    return block


@pytest.mark.parametrize("rows", [1, 16])
def test_kernel_equals_the_torch_loop(tmp_path: Any, rows: int) -> None:
    block = _moe_block(tmp_path)
    x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows))
    with torch.no_grad():
        ours = block(x)  # the C++ kernel
        ref = block._experts_loop(x, block.gate(x))
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)


def test_a_decode_step_reads_only_the_selected_experts(tmp_path: Any) -> None:
    block = _moe_block(tmp_path)
    x = torch.randn(1, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        chosen = set(torch.topk(block.gate(x), block.top_k, dim=-1).indices[0].tolist())
        clean = block(x)
        unused = next(e for e in range(block.num_experts) if e not in chosen)
        block.experts[unused].down_proj.prepared.packed.fill_(float("nan"))
        assert torch.equal(block(x), clean)  # never read
        used = min(chosen)
        block.experts[used].down_proj.prepared.packed.fill_(float("nan"))
        assert torch.isnan(block(x)).all()  # the poison shows where an expert is read
