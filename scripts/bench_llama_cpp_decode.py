"""Time llama.cpp's decode step on a GGUF file: the peer's side of profile_step.py.

    ~/peer-llama/bin/python scripts/bench_llama_cpp_decode.py FILE.gguf \
        [--batch 1 16] [--seq-len 128] [--steps 10] [--threads 2]

Runs under a python with llama-cpp-python (docs/benchmarks.md: the peers), through
its C API as llama.cpp's `llama-batched-bench` does: `--batch` sequences, each
prefilled with `--seq-len` random tokens, then `--steps` decode steps of one token
per sequence in one `llama_decode` call. Prints the median step time and tokens per
second per batch size, the figures `scripts/profile_step.py --model-path FILE`
prints for radixlm (its requests also start with `--seq-len` tokens of context).
Imports nothing from radixlm.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

import llama_cpp as lc


def _fill(batch: Any, tokens: list[tuple[int, int, int]]) -> None:
    """tokens: (token, position, sequence) per row, every row's logits requested."""
    for i, (token, pos, seq) in enumerate(tokens):
        batch.token[i], batch.pos[i] = token, pos
        batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = 1, seq, True
    batch.n_tokens = len(tokens)


def _decode(ctx: Any, batch: Any, tokens: list[tuple[int, int, int]]) -> float:
    _fill(batch, tokens)
    start = time.perf_counter()
    if lc.llama_decode(ctx, batch) != 0:
        raise SystemExit("llama_decode failed (context too small?)")
    return time.perf_counter() - start


def bench(model: Any, n_vocab: int, batch_size: int, seq_len: int, steps: int,
          threads: int) -> list[float]:
    """Seconds per decode step of batch_size sequences of seq_len tokens."""
    params = lc.llama_context_default_params()
    params.n_ctx = batch_size * (seq_len + steps + 16)
    params.n_batch = params.n_ubatch = max(512, batch_size)
    params.n_seq_max = batch_size
    params.n_threads = params.n_threads_batch = threads
    ctx = lc.llama_init_from_model(model, params)
    batch = lc.llama_batch_init(params.n_batch, 0, 1)
    rng = random.Random(0)
    try:
        for seq in range(batch_size):  # prefill, in chunks of n_batch
            for start in range(0, seq_len, params.n_batch):
                n = min(params.n_batch, seq_len - start)
                _decode(ctx, batch, [(rng.randrange(n_vocab), start + i, seq) for i in range(n)])
        times = []
        for step in range(steps):
            times.append(_decode(ctx, batch, [(rng.randrange(n_vocab), seq_len + step, seq)
                                              for seq in range(batch_size)]))
        return times
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("gguf")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    lc.llama_backend_init()
    model = lc.llama_model_load_from_file(args.gguf.encode(), lc.llama_model_default_params())
    if not model:
        raise SystemExit(f"llama.cpp could not load {args.gguf}")
    n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    print(f"llama.cpp {lc.__version__} on {args.gguf}, {args.threads} threads, "
          f"{args.seq_len} tokens of context")
    print(f"{'batch':>6}{'step ms':>10}{'tok/s':>9}  steps (ms)")
    for batch_size in args.batch:
        times = bench(model, n_vocab, batch_size, args.seq_len, args.steps, args.threads)
        median = statistics.median(times)
        print(f"{batch_size:>6}{median * 1e3:>10.1f}{batch_size / median:>9.1f}  "
              + " ".join(f"{t * 1e3:.0f}" for t in times))
    lc.llama_model_free(model)


if __name__ == "__main__":
    main()
