"""Throughput of one process against tensor and data parallelism, side by side.

    python -m radixlm.bench.parallel [--configs tp1 tp3 dp2] [--num-prompts 16]
        [--output-len 64] [--device cpu|cuda] [--model-path ...]

Each configuration starts an Engine (`tpN`: --tp-size N, `dpN`: --dp-size N,
`tpNdpM`: both), warms it up, then generates `--num-prompts` greedy
completions of `--output-len` tokens at once and reports output tokens/s and
the wall time. The default model has 9 query heads and 3 KV heads, so its TP
sizes are 1, 3 and 9. On a CPU all ranks share the machine's cores (each rank
takes cores / ranks threads), so TP pays its all-reduces (two per layer) and
the per-step broadcast without gaining compute; on GPUs each rank has its own.
"""

from __future__ import annotations

import argparse
import re
import time

from radixlm.entrypoints.engine import Engine
from radixlm.server_args import ServerArgs

PROMPTS = ["Write a short story about a robot who learns to paint.",
           "Explain how a bicycle works.", "List five facts about the Moon.",
           "Describe a walk through a forest in autumn."]


def parse_config(name: str) -> tuple[int, int]:
    """"tp3" -> (3, 1), "dp2" -> (1, 2), "tp3dp2" -> (3, 2): (tp_size, dp_size)."""
    match = re.fullmatch(r"(?:tp(\d+))?(?:dp(\d+))?", name)
    if not match or not any(match.groups()):
        raise SystemExit(f"unknown config {name!r}: use tpN, dpN or tpNdpM")
    return int(match[1] or 1), int(match[2] or 1)


def run(name: str, args: argparse.Namespace) -> tuple[float, float]:
    params = {"max_new_tokens": args.output_len, "temperature": 0, "ignore_eos": True}
    prompts = [PROMPTS[i % len(PROMPTS)] + f" ({i})" for i in range(args.num_prompts)]
    tp_size, dp_size = parse_config(name)
    server_args = ServerArgs(model_path=args.model_path, device=args.device,
                             max_total_tokens=16384, tp_size=tp_size, dp_size=dp_size)
    with Engine(server_args) as engine:
        engine.generate(prompts[:2], {**params, "max_new_tokens": 4})  # warm-up
        start = time.perf_counter()
        outs = engine.generate(prompts, params)
        wall = time.perf_counter() - start
    num_tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return num_tokens / wall, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=["tp1", "tp3", "dp2"])
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model-path", default=None)
    args = parser.parse_args()
    results = {name: run(name, args) for name in args.configs}
    base = results[args.configs[0]][0]
    print(f"\n{args.num_prompts} prompts x {args.output_len} tokens, greedy, {args.device}")
    print("| config | output tok/s | wall s | vs " + args.configs[0] + " |\n|---|---|---|---|")
    for name, (tps, wall) in results.items():
        print(f"| {name} | {tps:.1f} | {wall:.2f} | {tps / base:.2f}x |")


if __name__ == "__main__":
    main()
