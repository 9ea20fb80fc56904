"""The ways a step extends requests, each compared with transformers' logits.

Every check builds a PoolRunner over `ours`, runs a scripted set of steps and
asserts each step's logits equal transformers' on the full sequences (`hf`)
within `ATOL`: a whole prompt, a prefix hit, chunked prefill, a mixed batch
(decodes of different lengths, a chunk after a prefix, a 1-token and a fresh
prompt at once) and several decode steps. `n` scales the sequence lengths
(sliding-window tests use sequences longer than the window).
"""

from __future__ import annotations

from typing import Any

import torch
from _forward_harness import PoolRunner, hf_logits

ATOL = RTOL = 1e-4


def prompt(n: int, seed: int, vocab: int = 256) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def close(actual: torch.Tensor, expected: torch.Tensor, atol: float = ATOL) -> None:
    torch.testing.assert_close(actual, expected, atol=atol, rtol=RTOL)


def full_prefill(hf: Any, ours: Any, config: Any, backend: str = "torch_native",
                 n: int = 19) -> None:
    ids = prompt(n, seed=1)
    runner = PoolRunner(ours, config, backend=backend)
    (logits,) = runner.step([(runner.new_request(), ids)])
    close(logits, hf_logits(hf, ids))


def prefix_hit(hf: Any, ours: Any, config: Any, backend: str = "torch_native",
               n: int = 23) -> None:
    ids = prompt(n, seed=2)
    runner = PoolRunner(ours, config, backend=backend)
    first = runner.new_request()
    runner.step([(first, ids[:9])])
    # A second request reuses the first one's 9 cached slots and computes the rest.
    second = runner.new_request(share_prefix_of=first, prefix_len=9)
    (logits,) = runner.step([(second, ids[9:])])
    close(logits, hf_logits(hf, ids)[9:])


def chunked_prefill(hf: Any, ours: Any, config: Any, backend: str = "torch_native",
                    n: int = 30) -> None:
    ids = prompt(n, seed=3)
    runner = PoolRunner(ours, config, backend=backend)
    row = runner.new_request()
    cuts = [0, 7, 8, 20, n]
    logits = torch.cat([runner.step([(row, ids[a:b])])[0] for a, b in zip(cuts, cuts[1:])])
    close(logits, hf_logits(hf, ids))


def mixed_batch(hf: Any, ours: Any, config: Any, backend: str = "torch_native",
                scale: int = 1) -> None:
    """Decodes (different lengths), a chunk after a prefix, a 1-token and a fresh prompt."""
    lens = [12 * scale, 17 * scale, 25 * scale, 1, 9 * scale]
    seqs = [prompt(n, seed=10 + n) for n in lens]
    runner = PoolRunner(ours, config, backend=backend)
    rows = [runner.new_request() for _ in seqs]
    cut = 10 * scale
    runner.step([(rows[0], seqs[0][:-1]), (rows[1], seqs[1][:-1]), (rows[2], seqs[2][:cut])])
    out = runner.step([
        (rows[0], seqs[0][-1:]),  # a decode
        (rows[2], seqs[2][cut:]),  # an extend after a prefix
        (rows[3], seqs[3]),  # a 1-token prompt (decode-shaped, no prefix)
        (rows[1], seqs[1][-1:]),  # a decode at another length
        (rows[4], seqs[4]),  # a fresh prompt
    ])
    close(out[0], hf_logits(hf, seqs[0])[-1:])
    close(out[1], hf_logits(hf, seqs[2])[cut:])
    close(out[2], hf_logits(hf, seqs[3]))
    close(out[3], hf_logits(hf, seqs[1])[-1:])
    close(out[4], hf_logits(hf, seqs[4]))


def decode_steps(hf: Any, ours: Any, config: Any, backend: str = "torch_native",
                 prompt_lens: tuple[int, ...] = (3, 7, 10)) -> None:
    seqs = [prompt(p + 3, seed=20 + p) for p in prompt_lens]
    runner = PoolRunner(ours, config, backend=backend)
    rows = [runner.new_request() for _ in seqs]
    runner.step([(r, s[:p]) for r, s, p in zip(rows, seqs, prompt_lens)])
    for t in range(3):
        out = runner.step([(r, [s[p + t]]) for r, s, p in zip(rows, seqs, prompt_lens)])
        for logits, s, p in zip(out, seqs, prompt_lens):
            close(logits, hf_logits(hf, s[: p + t + 1])[-1:])
