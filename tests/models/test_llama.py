"""Llama / Mistral / Qwen2 logits equal transformers' through every way a step extends a request."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _forward_harness import PoolRunner, build_and_load, build_hf_model, hf_logits

from radixlm.model_loader.loader import load_model

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    # llama3 rope scaling, tied embeddings, biases on attention and MLP
    "llama": (
        "llama",
        dict(
            tie_word_embeddings=True,
            attention_bias=True,
            mlp_bias=True,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
    ),
    # head_dim that is not hidden / heads; linear rope scaling
    "mistral": ("mistral", dict(head_dim=32, rope_scaling={"rope_type": "linear", "factor": 2.0})),
    # q/k/v biases, untied head
    "qwen2": ("qwen2", dict(rope_theta=1e6, tie_word_embeddings=False)),
}

ATOL = RTOL = 1e-4


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def models(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    model_type, overrides = VARIANTS[request.param]
    return build_and_load(model_type, overrides, tmp_path_factory.mktemp(request.param))


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), generator=g).tolist()


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=RTOL)


def test_full_prefill(models) -> None:
    hf, ours, config = models
    ids = _prompt(19, seed=1)
    runner = PoolRunner(ours, config)
    (logits,) = runner.step([(runner.new_request(), ids)])
    _close(logits, hf_logits(hf, ids))


def test_prefix_cache_hit(models) -> None:
    hf, ours, config = models
    ids = _prompt(23, seed=2)
    runner = PoolRunner(ours, config)
    first = runner.new_request()
    runner.step([(first, ids[:9])])
    # A second request reuses the first one's 9 cached slots and computes the rest.
    second = runner.new_request(share_prefix_of=first, prefix_len=9)
    (logits,) = runner.step([(second, ids[9:])])
    _close(logits, hf_logits(hf, ids)[9:])


def test_chunked_prefill(models) -> None:
    hf, ours, config = models
    ids = _prompt(30, seed=3)
    runner = PoolRunner(ours, config)
    row = runner.new_request()
    chunks = [ids[:7], ids[7:8], ids[8:20], ids[20:]]
    logits = torch.cat([runner.step([(row, c)])[0] for c in chunks])
    _close(logits, hf_logits(hf, ids))


def test_mixed_batch(models) -> None:
    """Decodes (different lengths), a chunk after a prefix, a 1-token and a fresh prompt at once."""
    hf, ours, config = models
    seqs = [_prompt(n, seed=10 + n) for n in (12, 17, 25, 1, 9)]
    runner = PoolRunner(ours, config)
    rows = [runner.new_request() for _ in seqs]
    runner.step([(rows[0], seqs[0][:11]), (rows[1], seqs[1][:16]), (rows[2], seqs[2][:10])])
    out = runner.step(
        [
            (rows[0], seqs[0][11:]),  # decode at length 12
            (rows[2], seqs[2][10:]),  # extend 15 tokens after a 10-token prefix
            (rows[3], seqs[3]),  # a 1-token prompt (decode-shaped, no prefix)
            (rows[1], seqs[1][16:]),  # decode at length 17
            (rows[4], seqs[4]),  # a fresh 9-token prompt
        ]
    )
    _close(out[0], hf_logits(hf, seqs[0])[11:])
    _close(out[1], hf_logits(hf, seqs[2])[10:])
    _close(out[2], hf_logits(hf, seqs[3]))
    _close(out[3], hf_logits(hf, seqs[1])[16:])
    _close(out[4], hf_logits(hf, seqs[4]))


def test_decode_steps(models) -> None:
    hf, ours, config = models
    seqs = [_prompt(n, seed=20 + n) for n in (6, 11, 14)]
    runner = PoolRunner(ours, config)
    rows = [runner.new_request() for _ in seqs]
    prompt_len = [3, 7, 10]
    runner.step([(r, s[:p]) for r, s, p in zip(rows, seqs, prompt_len)])
    for t in range(3):
        out = runner.step([(r, [s[p + t]]) for r, s, p in zip(rows, seqs, prompt_len)])
        for logits, s, p in zip(out, seqs, prompt_len):
            _close(logits, hf_logits(hf, s[: p + t + 1])[-1:])


def test_sharded_checkpoint(tmp_path) -> None:
    hf = build_hf_model("qwen2", seed=5)
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    ours, config = load_model(str(tmp_path), torch.float32, "cpu")
    ids = _prompt(8, seed=6)
    runner = PoolRunner(ours, config)
    (logits,) = runner.step([(runner.new_request(), ids)])
    _close(logits, hf_logits(hf, ids))
