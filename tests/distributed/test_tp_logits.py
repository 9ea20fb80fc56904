"""Tensor parallelism on tiny random models: TP=2 logits equal TP=1 within 1e-4.

Two real rank processes on gloo run the same scripted steps (a chunked prefill,
a prefix hit, a mixed decode; see _tp_ranks.py) on Llama, Qwen2 (q/k/v bias),
Mistral, and a Llama with one KV head (two ranks: the head is replicated). All
four models go through one pair of processes, which keeps the test to one
start-up.
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
from tests.models._forward_harness import build_hf_model

HERE = Path(__file__).parent

CASES = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "mistral": ("mistral", {}),
    "llama_one_kv_head": ("llama", {"num_key_value_heads": 1}),
}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    dirs = {}
    for name, (model_type, overrides) in CASES.items():
        path = tmp_path_factory.mktemp(name)
        # vocab 250: not a multiple of the TP size, so the last rank's part is padded
        build_hf_model(model_type, vocab_size=250, **overrides).save_pretrained(path)
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
