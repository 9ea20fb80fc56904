"""Qwen3, Qwen3-MoE, Gemma 3, Phi-3 / Phi-4-mini, SmolLM3, Mistral / Ministral / Qwen2 with
sliding windows: logits equal transformers' (float32, within 1e-4) through a whole prompt,
a prefix hit, chunked prefill, a mixed batch and decode steps, on tiny random configs that
switch on each family's features. Sliding-window variants use windows of 8 tokens and
sequences of up to 30, so windows slide; the mixed batch and chunked prefill also run
through the CPU paged backend, whose kernel takes the windows (head dim 16: chunks over
16 rows go to the masked torch path) and Gemma's scale (test_window_kernel.py: head dim
64, every step in the kernel). The attention softcap itself is tested
against a reference in tests/layers/test_attention_options.py.
"""

from __future__ import annotations

from typing import Any

import _scenarios as sc
import pytest
import torch
from _forward_harness import build_hf_model, perturb_weights

from radixlm.layers.cpu_kernels import load_cpu_kernels
from radixlm.model_loader.loader import load_model

WINDOW = 8
_GEMMA = dict(head_dim=16, num_hidden_layers=3, sliding_window=WINDOW, query_pre_attn_scalar=24,
              layer_types=["sliding_attention", "full_attention", "sliding_attention"],
              rope_parameters={
                  "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                  "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
              final_logit_softcapping=30.0)
_PHI3 = dict(pad_token_id=0, partial_rotary_factor=0.5, original_max_position_embeddings=32,
             rope_scaling={"rope_type": "longrope", "short_factor": [1.0, 1.3, 1.7, 2.2],
                           "long_factor": [1.0, 2.0, 4.0, 8.0],
                           "original_max_position_embeddings": 32})
_MOE = dict(head_dim=16, num_hidden_layers=3, num_experts=8, num_experts_per_tok=2,
            moe_intermediate_size=32, mlp_only_layers=[1])

# name → (transformers model_type, config overrides, context length served or None)
FAMILIES: dict[str, tuple[str, dict[str, Any], int | None]] = {
    "qwen3": ("qwen3", dict(head_dim=16, tie_word_embeddings=False), None),
    "qwen3_window": ("qwen3", dict(head_dim=16, use_sliding_window=True, sliding_window=WINDOW,
                                   max_window_layers=1), None),
    "qwen3_moe": ("qwen3_moe", dict(_MOE, norm_topk_prob=True), None),
    "gemma3": ("gemma3_text", _GEMMA, None),
    # LongRoPE's short factors: served with a context no longer than the original 32
    "phi3": ("phi3", dict(_PHI3, sliding_window=WINDOW), 32),
    "phi4_mini": ("phi3", dict(_PHI3, tie_word_embeddings=True), 32),
    "smollm3": ("smollm3", dict(num_hidden_layers=4, pad_token_id=0), None),
    "smollm3_window": ("smollm3", dict(num_hidden_layers=4, pad_token_id=0, use_sliding_window=True,
                                       sliding_window=WINDOW), None),
    "mistral_window": ("mistral", dict(sliding_window=WINDOW), None),
    "ministral": ("ministral", dict(head_dim=16, sliding_window=WINDOW,
                                    layer_types=["sliding_attention", "full_attention"]), None),
    "qwen2_window": ("qwen2", dict(use_sliding_window=True, sliding_window=WINDOW,
                                   max_window_layers=1), None),
}


def build(model_type: str, overrides: dict[str, Any]) -> torch.nn.Module:
    hf = build_hf_model(model_type, **overrides)
    # Routers away from their zero init: ties between experts would make top-k arbitrary.
    return perturb_weights(hf, extra=("mlp.gate.weight",))


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    model_type, overrides, context_len = FAMILIES[request.param]
    hf = build(model_type, overrides)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    ours, config = load_model(str(path), torch.float32, "cpu")
    if context_len is not None:
        ours.set_context_length(context_len)
    return hf, ours, config


def test_full_prefill(family) -> None:
    sc.full_prefill(*family)


def test_prefix_hit(family) -> None:
    sc.prefix_hit(*family)


def test_chunked_prefill(family) -> None:
    sc.chunked_prefill(*family)


def test_mixed_batch(family) -> None:
    sc.mixed_batch(*family)


def test_decode_steps(family) -> None:
    sc.decode_steps(*family)


@pytest.mark.skipif(load_cpu_kernels() is None, reason="no CPU kernels")
def test_cpu_paged_backend(family) -> None:
    sc.mixed_batch(*family, backend="cpu_paged")
    sc.chunked_prefill(*family, backend="cpu_paged")


# Variants of one feature: one scenario each (the mixed batch has every kind of row).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3_moe_unnormed": ("qwen3_moe", dict(_MOE, norm_topk_prob=False, mlp_only_layers=[])),
    # transformers' Gemma 3 ignores attn_logit_softcapping: so must we
    "gemma3_attn_softcap": ("gemma3_text", dict(_GEMMA, attn_logit_softcapping=20.0)),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_mixed_batch(name: str, tmp_path) -> None:
    model_type, overrides = VARIANTS[name]
    hf = build(model_type, overrides)
    hf.save_pretrained(tmp_path)
    ours, config = load_model(str(tmp_path), torch.float32, "cpu")
    sc.mixed_batch(hf, ours, config)


def test_phi3_long_rope(tmp_path) -> None:
    """Served past the original context, LongRoPE takes its long factors for every
    position: equal to transformers on sequences longer than the original 32 tokens."""
    hf = build("phi3", _PHI3)
    hf.save_pretrained(tmp_path)
    ours, config = load_model(str(tmp_path), torch.float32, "cpu")  # context 256 > 32
    sc.full_prefill(hf, ours, config, n=40)
    sc.prefix_hit(hf, ours, config, n=45)
    sc.chunked_prefill(hf, ours, config, n=50)
    sc.decode_steps(hf, ours, config, prompt_lens=(33, 36, 40))


@pytest.mark.skipif(load_cpu_kernels() is None, reason="no CPU kernels")
def test_fast_path_refuses_what_it_lacks(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A layer the C++ stack cannot run (an attention logit softcap: no family served
    today has one, so it is set by hand) takes the Python loop, says why and where at
    start-up, and never reaches the stack (packed weights or not)."""
    from radixlm.layers.attention import AttnOptions
    from radixlm.layers.prepared_weight import prepare_model
    from radixlm.models.layer_stack import fast_path_report, stack_for

    model_type, overrides, _ = FAMILIES["mistral_window"]
    build(model_type, overrides).save_pretrained(tmp_path)
    ours, _ = load_model(str(tmp_path), torch.float32, "cpu")
    layer = ours.model.layers[1]
    monkeypatch.setattr(layer.self_attn, "attn_options",
                        AttnOptions(sliding_window=WINDOW, logit_softcap=20.0))
    layer.program = layer.build_program()  # as the layer builds it from its options
    prepare_model(ours)
    report = fast_path_report(ours)
    why = "attention logit softcapping (not in the paged kernel yet) (layer 1)"
    assert report is not None and "Python layer loop" in report and why in report, report
    assert stack_for(ours.model) is None


@pytest.mark.parametrize("name", ["qwen3", "qwen3_moe", "phi4_mini", "smollm3", "ministral",
                                  "gemma3", "phi3", "mistral_window"])
def test_fast_path_takes_the_families(name: str, tmp_path) -> None:
    """Every family's layer program runs in the C++ stack once its weights are packed
    (and the log says so), sliding windows included (the paged kernel takes them);
    tests/models/test_layer_stack.py checks it equals the Python loop."""
    from radixlm.layers.cpu_gemm import can_pack, pairs_capable
    from radixlm.layers.prepared_weight import prepare_model
    from radixlm.models.layer_stack import fast_path_report, stack_for

    w = torch.zeros(16, 16)
    if load_cpu_kernels() is None or not (pairs_capable(w) or can_pack(w)):
        pytest.skip("no packed float32 weights on this CPU")
    model_type, overrides, _ = FAMILIES[name]
    build(model_type, overrides).save_pretrained(tmp_path)
    ours, _ = load_model(str(tmp_path), torch.float32, "cpu")
    assert stack_for(ours.model) is None  # dense weights: the Python loop
    prepare_model(ours)
    assert "the C++ layer stack" in (fast_path_report(ours) or ""), fast_path_report(ours)
    assert stack_for(ours.model) is not None


@pytest.mark.skipif(load_cpu_kernels() is None, reason="no CPU kernels")
@pytest.mark.parametrize("name", ["qwen3_moe", "gemma3", "phi4_mini", "smollm3_window"])
def test_bfloat16_prepared_weights_run(name: str, tmp_path) -> None:
    """The families in bfloat16 with prepared (packed) weights, experts included, through
    the paged backend and the fused kernels: next-token logits close to float32's."""
    from radixlm.layers.prepared_weight import prepare_model

    model_type, overrides, context_len = FAMILIES[name]
    build(model_type, overrides).save_pretrained(tmp_path)
    logits = {}
    for dtype in (torch.float32, torch.bfloat16):
        ours, config = load_model(str(tmp_path), dtype, "cpu")
        if context_len is not None:
            ours.set_context_length(context_len)
        prepare_model(ours)
        runner = sc.PoolRunner(ours, config, dtype=dtype, backend="cpu_paged")
        row = runner.new_request()
        runner.step([(row, sc.prompt(20, seed=5))])
        (logits[dtype],) = runner.step([(row, [7])])
    ref, got = logits[torch.float32][0], logits[torch.bfloat16][0].float()
    assert torch.nn.functional.cosine_similarity(ref, got, dim=0) > 0.99
