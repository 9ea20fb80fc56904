"""Speculative decoding on vs off, side by side in one run (a benchmark, not a test).

    .venv/bin/python scripts/bench_speculative.py                 # both workloads, c = 1 4 16
    .venv/bin/python scripts/bench_speculative.py --concurrency 1 --workload grounded

Two Engines on the default model share the process, one with
`--speculative-algorithm NGRAM` and one without; each (workload,
concurrency) cell runs on both, alternating, `--repeats` times, and reports
the best run of each (the machine may be shared: compare the ratio, not
the absolute numbers). Workloads, each request asking for `--output-len`
tokens with ignore_eos, greedy:

- grounded: a ~300-token incident report (fields and free text) and a task
  that copies or restates some of it (copy a field, list the steps, write
  fields as JSON): the input-grounded case where prompt lookup finds drafts;
- chat: radixlm.bench.serving's built-in chat prompts (nothing to copy).

Columns: output tok/s, forward steps per output token (meta_info
forward_steps / completion_tokens), the drafted tokens' acceptance rate, and
the speedup of speculation over plain decoding, and how many outputs are
token for token the same (all of them in float32; in bfloat16 a 1 + K-row step
may break a near-tie the other way, as batching does).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from radixlm import Engine  # noqa: E402
from radixlm.bench.serving import BUILTIN_PROMPTS, cpu_description  # noqa: E402

_NAMES = ["Ada Moreau", "Ben Okafor", "Chen Li", "Dana Ruiz", "Emil Novak", "Farah Aziz"]
_SYSTEMS = ["billing service", "login page", "search index", "mobile app", "report job"]
_SYMPTOMS = ["returns an empty page", "times out after thirty seconds", "shows the wrong "
             "currency", "logs the user out", "sends the same email twice"]
_SENTENCES = [
    "The {sys} {sym} when a customer opens it from the {place} on a {day} morning.",
    "It started after the release on {day}, and {name} saw it first in the {place}.",
    "About one request in {n} fails, and the error log says the cache was not ready.",
    "Restarting the {sys} helps for an hour, then the problem comes back.",
    "Customers in the {place} office reported it {n} times during the last week.",
    "The team suspects the new retry rule, because the failures follow each deploy.",
]
_TASKS = [
    "Copy the Summary field of the report above exactly, word for word.",
    "List the Steps to reproduce from the report above, exactly as written.",
    "Write the ID, Title, Owner and Status of the report above as a JSON object.",
    "Restate the report above: its title, its owner, and its summary.",
]


def incident_report(i: int) -> str:
    rng = random.Random(i)
    fill = {"sys": rng.choice(_SYSTEMS), "sym": rng.choice(_SYMPTOMS), "name": rng.choice(_NAMES),
            "place": rng.choice(["Berlin", "Lagos", "Lima", "Osaka", "Toronto"]),
            "day": rng.choice(["Monday", "Tuesday", "Thursday", "Friday"]),
            "n": rng.choice(["ten", "twenty", "fifty"])}
    summary = " ".join(s.format(**fill) for s in _SENTENCES)
    steps = "\n".join(f"{k}. " + s.format(**fill) for k, s in enumerate([
        "Sign in as a customer from the {place} office.", "Open the {sys}.",
        "Wait until the page has loaded, then refresh it twice.",
        "Check that the {sys} {sym}."], 1))
    return (f"ID: INC-{4100 + i}\nTitle: The {fill['sys']} {fill['sym']}\n"
            f"Owner: {fill['name']}\nStatus: open\nPriority: high\n\nSummary: {summary}\n\n"
            f"Steps to reproduce:\n{steps}\n\nNotes: {summary}")


def build_prompts(engine: Engine, workload: str, num: int) -> list[str]:
    tokenizer = engine.tokenizer
    if workload == "grounded":
        contents = [incident_report(i) + "\n\n" + _TASKS[i % len(_TASKS)] for i in range(num)]
    else:
        contents = [BUILTIN_PROMPTS[i % len(BUILTIN_PROMPTS)] for i in range(num)]
    return [tokenizer.apply_chat_template([{"role": "user", "content": c}], tokenize=False,
                                          add_generation_prompt=True) for c in contents]


async def _run(engine: Engine, prompts: list[str], concurrency: int,
               params: dict[str, Any]) -> list[dict[str, Any]]:
    gate = asyncio.Semaphore(concurrency)

    async def one(prompt: str) -> dict[str, Any]:
        async with gate:
            return dict(await engine.async_generate(prompt, params))

    return await asyncio.gather(*(one(p) for p in prompts))


def run_cell(engine: Engine, prompts: list[str], concurrency: int,
             output_len: int) -> dict[str, float]:
    params = {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True}
    start = time.perf_counter()
    outs = asyncio.run(_run(engine, prompts, concurrency, params))
    elapsed = time.perf_counter() - start
    metas = [o["meta_info"] for o in outs]
    num_out = sum(m["completion_tokens"] for m in metas)
    drafted = sum(m.get("spec_draft_tokens", 0) for m in metas)
    accepted = sum(m.get("spec_accepted_tokens", 0) for m in metas)
    return {
        "tok_s": num_out / elapsed,
        "steps_per_token": sum(m["forward_steps"] for m in metas) / num_out,
        "accept_rate": accepted / drafted if drafted else 0.0,
        "drafted_per_token": drafted / num_out,
        "outputs": [o["output_ids"] for o in outs],  # type: ignore[dict-item]
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", nargs="+", default=["grounded", "chat"],
                   choices=["grounded", "chat"])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-prompts", type=int, default=0,
                   help="requests per cell (default: max(4, 2 x concurrency))")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--num-draft-tokens", type=int, default=None)
    p.add_argument("--min-match-window", type=int, default=None)
    p.add_argument("--dtype", default="auto", help="float32 shows that outputs match exactly "
                   "(bfloat16 steps of other shapes may break near-ties either way)")
    args = p.parse_args()
    common: dict[str, Any] = {"max_total_tokens": 32768, "log_level": "warning",
                              "dtype": args.dtype}
    spec_kwargs: dict[str, Any] = {"speculative_algorithm": "NGRAM"}
    if args.num_draft_tokens is not None:
        spec_kwargs["speculative_num_draft_tokens"] = args.num_draft_tokens
    if args.min_match_window is not None:
        spec_kwargs["speculative_ngram_min_match_window_size"] = args.min_match_window
    print(f"CPU: {cpu_description()}; dtype {args.dtype}; output {args.output_len} tokens, "
          "greedy, ignore_eos")
    with Engine(**common) as off, Engine(**common, **spec_kwargs) as on:
        for engine in (off, on):  # warm up both
            engine.generate(build_prompts(engine, "grounded", 1)[0], {"max_new_tokens": 8})
        print("| workload | conc | off tok/s | on tok/s | speedup | off steps/tok "
              "| on steps/tok | accept rate | identical outputs |")
        print("|---|---|---|---|---|---|---|---|---|")
        for workload in args.workload:
            for conc in args.concurrency:
                num = args.num_prompts or max(4, 2 * conc)
                prompts = build_prompts(off, workload, num)
                best: dict[str, dict[str, Any]] = {}
                for _ in range(args.repeats):
                    for name, engine in (("off", off), ("on", on)):
                        cell = run_cell(engine, prompts, conc, args.output_len)
                        if name not in best or cell["tok_s"] > best[name]["tok_s"]:
                            best[name] = cell
                a, b = best["off"], best["on"]
                print(f"| {workload} | {conc} | {a['tok_s']:.1f} | {b['tok_s']:.1f} | "
                      f"{b['tok_s'] / a['tok_s']:.2f}x | {a['steps_per_token']:.3f} | "
                      f"{b['steps_per_token']:.3f} | {b['accept_rate']:.2f} | "
                      f"{_num_identical(a['outputs'], b['outputs'])}/{num} |", flush=True)


def _num_identical(a: list[list[int]], b: list[list[int]]) -> int:
    return sum(x == y for x, y in zip(a, b))


if __name__ == "__main__":
    main()
