"""Tensor parallelism on tiny random models: TP=2 logits equal TP=1 within 1e-4.

Two real rank processes on gloo run the same scripted steps (a chunked prefill,
a prefix hit, a mixed decode; see _tp_ranks.py) on Llama, Qwen2 (q/k/v bias),
Mistral, a Llama with one KV head (two ranks: the head is replicated), and the
families of tests/models/test_families.py: Qwen3 with sliding windows,
Qwen3-MoE (each expert split over the ranks), Gemma 3, Phi-3 (fused
checkpoint tensors, partial rotary) and SmolLM3 (NoPE layers). All models go
through one pair of processes, which keeps the test to one start-up.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from radixlm.distributed.parallel_state import check_tp_layout, free_loopback_addr
from tests.distributed._tp_ranks import scripted_logits
from tests.models._forward_harness import build_hf_model, perturb_weights

HERE = Path(__file__).parent

CASES = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "mistral": ("mistral", {}),
    "llama_one_kv_head": ("llama", {"num_key_value_heads": 1}),
    # the families of tests/models/test_families.py (sliding windows slide: 8 < 24 tokens)
    "qwen3_window": ("qwen3", {"head_dim": 16, "use_sliding_window": True,
                               "sliding_window": 8, "max_window_layers": 1}),
    "qwen3_moe": ("qwen3_moe", {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                                "moe_intermediate_size": 32, "norm_topk_prob": True}),
    "gemma3": ("gemma3_text", {"head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 24,
                               "layer_types": ["sliding_attention", "full_attention"],
                               "final_logit_softcapping": 30.0}),
    "phi3": ("phi3", {"pad_token_id": 0, "partial_rotary_factor": 0.5}),
    "smollm3": ("smollm3", {"pad_token_id": 0, "num_hidden_layers": 4}),
}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    dirs = {}
    for name, (model_type, overrides) in CASES.items():
        path = tmp_path_factory.mktemp(name)
        # vocab 250: not a multiple of the TP size, so the last rank's part is padded
        hf = build_hf_model(model_type, vocab_size=250, **overrides)
        perturb_weights(hf, extra=("mlp.gate.weight",)).save_pretrained(path)  # MoE routers
        dirs[name] = str(path)
    return dirs


@pytest.fixture(scope="module")
def tp2_logits(model_dirs: dict[str, str], tmp_path_factory: pytest.TempPathFactory
               ) -> dict[str, list[torch.Tensor]]:
    out = tmp_path_factory.mktemp("tp2") / "logits.pt"
    addr = free_loopback_addr()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parents[1])}
    cmd = [sys.executable, str(HERE / "_tp_ranks.py"), "{rank}", "2", addr, str(out),
           *model_dirs.values()]
    procs = [subprocess.Popen([c.format(rank=r) for c in cmd], env=env) for r in range(2)]
    try:
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert codes == [0, 0], f"rank exit codes {codes}"
    return torch.load(out)  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", list(CASES))
def test_tp2_logits_match_tp1(name: str, model_dirs: dict[str, str],
                              tp2_logits: dict[str, list[torch.Tensor]]) -> None:
    reference = scripted_logits(model_dirs[name])
    got = tp2_logits[model_dirs[name]]
    assert len(got) == len(reference) == 4
    for step, (a, b) in enumerate(zip(reference, got)):
        assert a.shape == b.shape, f"step {step}: {a.shape} vs {b.shape}"
        diff = (a - b).abs().max().item()
        assert diff < 1e-4, f"{name} step {step}: max |TP2 - TP1| = {diff}"


def test_layout_refused_with_the_sizes_that_fit() -> None:
    from transformers import LlamaConfig

    config = LlamaConfig(num_attention_heads=9, num_key_value_heads=3, hidden_size=576,
                         intermediate_size=1536, architectures=["LlamaForCausalLM"])
    check_tp_layout(config, 3)
    check_tp_layout(LlamaConfig(num_attention_heads=4, num_key_value_heads=2, hidden_size=64,
                                intermediate_size=128, architectures=["LlamaForCausalLM"]), 4)
    with pytest.raises(ValueError, match=r"--tp-size 2 cannot split .* 9 attention heads, "
                                         r"3 KV heads.* fit: 1, 3"):
        check_tp_layout(config, 2)
