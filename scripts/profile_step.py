"""Time and profile one decode step of the default model, per precision and attention backend.

    .venv/bin/python scripts/profile_step.py [--batch 32 [1 16 ...]] [--seq-len 400] [--steps 10]
        [--configs fp32:torch_native fp32:cpu_paged bf16:cpu_paged int8:cpu_paged] [--profile]
    .venv/bin/python scripts/profile_step.py --prefill 2000 [--chunk 512] ...
    .venv/bin/python scripts/profile_step.py --model-path DIR_OR_GGUF ...  (default: the default model)

    .venv/bin/python scripts/profile_step.py --model-path M --batch 1 --seq-len 8000 \
        --configs bf16:cpu_paged bf16:cpu_paged:kv=int8      # KV dtypes side by side

Each config is `precision:backend[:loop][:kv=DTYPE]` (precision fp32, bf16, bf16w = float32 over bf16 weights, int8 = W8A8 over
float32 activations, int8bf16 = W8A8 over bfloat16, gguf = a GGUF file's block formats
over float32 activations (gguf16: over bfloat16), q8_0 / q4_0 / q4_k = float weights
quantized at load; `--model-path` another model than the default; `:loop` runs the decoder
layers in the Python loop instead of the C++ layer stack, models/layer_stack.py;
`:kv=int8` a pool in that --kv-cache-dtype, auto otherwise).
The requests start with `--seq-len` tokens of random K/V in the pool, then decode
`--steps` steps; the configs run in turn, `--rounds` times, so their ratios are
measured side by side even on a busy machine. Several `--batch` sizes share one
load of each config (the larger pool serves the smaller batches: the first rows). `--profile` adds torch.profiler's split of one step's time
(attention, linear layers, LM head, the rest). `--prefill N` times one request's
prompt of N tokens instead, in chunks of `--chunk` (the server's
--chunked-prefill-size), as a server's TTFT would spend it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "models"))

from _forward_harness import PoolRunner  # noqa: E402

from radixlm.layers.prepared_weight import prepare_model  # noqa: E402
from radixlm.mem_cache.kv_format import quantize_rows  # noqa: E402
from radixlm.model_executor.calibration import smooth_for_int8  # noqa: E402
from radixlm.model_loader.loader import load_model  # noqa: E402
from radixlm.model_loader.model_path import resolve_model_dir  # noqa: E402

PRECISIONS = {
    "fp32": (torch.float32, "none"),
    "bf16": (torch.bfloat16, "none"),
    "bf16w": (torch.float32, "bf16_weights"),
    "int8": (torch.float32, "w8a8_int8"),
    "int8bf16": (torch.bfloat16, "w8a8_int8"),
    "gguf": (torch.float32, "gguf"),
    "gguf16": (torch.bfloat16, "gguf"),
    "q8_0": (torch.float32, "q8_0"),
    "q4_0": (torch.float32, "q4_0"),
    "q4_k": (torch.float32, "q4_k"),
}
CATEGORIES = [
    ("attention", ("paged_attention", "index_select", "scaled_dot_product", "flash_attention",
                   "index_put", "_softmax", "bmm")),
    ("linear layers", ("_linear_pointwise", "_int_mm", "int8_linear", "quantize", "linear",
                       "pairs_linear", "bf16w_linear", "q_linear")),
]


def build(config: str, batch: int, seq_len: int, steps: int,
          model_path: str | None = None) -> tuple[PoolRunner, list[int]]:
    precision, backend, *rest = config.split(":")
    kv_dtype = next((r.removeprefix("kv=") for r in rest if r.startswith("kv=")), "auto")
    loop = [r for r in rest if not r.startswith("kv=")]
    dtype, quantization = PRECISIONS[precision]
    model_dir = resolve_model_dir(model_path)
    model, cfg = load_model(model_dir, dtype, "cpu", keep_quantized=quantization == "gguf")
    if quantization == "w8a8_int8":
        smooth_for_int8(model, cfg, model_dir)
    prepare_model(model, quantization)
    model.model.use_layer_stack = loop != ["loop"]
    total = batch * (seq_len + steps + 2)
    runner = PoolRunner(model, cfg, num_slots=total, max_requests=batch,
                        max_context=seq_len + steps + 2, dtype=dtype, backend=backend,
                        kv_cache_dtype=kv_dtype)
    rows = [runner.new_request() for _ in range(batch)]
    # NOTE: no prefill: random K/V stand in for a prompt (a decode step's cost does not
    # depend on the values), so building a config takes seconds, not minutes.
    fmt = runner.kv.kv_format
    for buf in runner.kv.k_buffers + runner.kv.v_buffers:
        buf.copy_(quantize_rows(torch.randn(*buf.shape[:2], fmt.head_dim, dtype=dtype), fmt))
    for row in rows:
        slots = runner.kv.alloc(seq_len)
        assert slots is not None
        runner.rows.req_to_token[row, :seq_len] = slots
        runner.cached[row] = seq_len
    return runner, rows


def decode_steps(runner: PoolRunner, rows: list[int], steps: int) -> float:
    """Median seconds per decode step; rolls the KV back afterwards so rounds repeat."""
    start_lens = {row: runner.cached[row] for row in rows}
    times = []
    for s in range(steps):
        t = time.perf_counter()
        runner.step([(row, [(row + s) % 1000 + 10]) for row in rows], last_only=True)
        times.append(time.perf_counter() - t)
    for row in rows:
        table = runner.rows.req_to_token[row]
        runner.kv.free(table[start_lens[row] : runner.cached[row]].clone())
        runner.cached[row] = start_lens[row]
    return statistics.median(times)


def prefill(runner: PoolRunner, row: int, tokens: int, chunk: int) -> float:
    """Seconds to prefill request `row` (empty) with `tokens` tokens, `chunk` a step;
    its KV is freed afterwards so rounds repeat."""
    ids = [(7 * i) % 1000 + 10 for i in range(tokens)]
    t = time.perf_counter()
    for start in range(0, tokens, chunk):
        runner.step([(row, ids[start : start + chunk])], last_only=True)
    elapsed = time.perf_counter() - t
    runner.kv.free(runner.rows.req_to_token[row, : runner.cached[row]].clone())
    runner.cached[row] = 0
    return elapsed


def profile_split(runner: PoolRunner, rows: list[int],
                  run: Callable[[], object] | None = None, table: bool = False) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        if run is not None:
            run()
        else:
            decode_steps(runner, rows, 3)
    if table:
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
    total = 0.0
    split: dict[str, float] = {}
    for event in prof.key_averages():
        self_us = event.self_cpu_time_total
        total += self_us
        name = event.key.lower()
        cat = next((c for c, keys in CATEGORIES if any(k in name for k in keys)), "rest")
        if "compute_logits" in name:
            cat = "LM head"
        split[cat] = split.get(cat, 0.0) + self_us
    return {k: 100 * v / total for k, v in sorted(split.items(), key=lambda kv: -kv[1])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, nargs="+", default=[32])
    p.add_argument("--seq-len", type=int, default=400)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--configs", nargs="+",
                   default=["fp32:torch_native", "fp32:cpu_paged", "bf16:cpu_paged",
                            "int8:cpu_paged"])
    p.add_argument("--profile", action="store_true")
    p.add_argument("--table", action="store_true",
                   help="with --profile: print torch.profiler's table of the top ops too")
    p.add_argument("--prefill", type=int, default=0, metavar="N",
                   help="time one N-token prompt's prefill instead of decode steps")
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--model-path", default=None,
                   help="an HF folder or GGUF file (default: the default model)")
    args = p.parse_args()
    torch.set_grad_enabled(False)
    print(f"threads {torch.get_num_threads()}, OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', 'default')}, batch {' '.join(map(str, args.batch))}, "
          f"seq {args.seq_len}")
    if args.prefill:  # one request, its own KV only
        built = {c: build(c, 1, args.prefill, 0, args.model_path) for c in args.configs}
        for runner, rows in built.values():
            runner.kv.free(runner.rows.req_to_token[rows[0], : runner.cached[rows[0]]].clone())
            runner.cached[rows[0]] = 0

        def measure(runner: PoolRunner, rows: list[int]) -> float:
            return prefill(runner, rows[0], args.prefill, args.chunk)
    else:
        built = {c: build(c, max(args.batch), args.seq_len, args.steps, args.model_path)
                 for c in args.configs}

        def measure(runner: PoolRunner, rows: list[int]) -> float:
            return decode_steps(runner, rows, args.steps)
    sizes = [1] if args.prefill else args.batch
    results: dict[tuple[str, int], list[float]] = {(c, b): [] for c in args.configs
                                                   for b in sizes}
    for _ in range(args.rounds):
        for (c, b), times in results.items():
            runner, rows = built[c]
            times.append(measure(runner, rows[:b]))
    base = {b: statistics.median(results[(args.configs[0], b)]) for b in sizes}
    unit = f"prefill {args.prefill} ms" if args.prefill else "step ms"
    print(f"{'config':<22}{'batch':>6}{unit:>10}{'tok/s':>8}{'vs first':>10}  rounds (ms)")
    for (c, b), times in results.items():
        med = statistics.median(times)
        tok_s = (args.prefill if args.prefill else b) / med
        print(f"{c:<22}{b:>6}{med * 1e3:>10.1f}{tok_s:>8.1f}{base[b] / med:>9.2f}x  "
              + " ".join(f"{t * 1e3:.1f}" for t in times))
    if args.profile:
        for c, (runner, rows) in built.items():
            rows = rows[: min(args.batch)]  # the smallest batch's profile
            split = profile_split(runner, rows, (lambda r=runner, q=rows: measure(r, q))
                                  if args.prefill else None, args.table)
            print(c, ", ".join(f"{k} {v:.0f}%" for k, v in split.items()))


if __name__ == "__main__":
    main()
