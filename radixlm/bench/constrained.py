"""Constrained decoding benchmark: a JSON-schema workload per grammar backend,
jump-forward on and off, with unconstrained decoding as the reference.

    python -m radixlm.bench.constrained [--backends xgrammar outlines llguidance]
        [--batch-sizes 1 16] [--num-batch1 3] [--compact]

The workload follows the LMSYS compressed-FSM post: character profiles with
fixed keys, enums and a nested object, greedy. Each configuration runs in its
own Engine, one after the other in this run, so ratios are side by side.
Columns:
- latency: mean seconds per request (batch 1: one request at a time; batch N:
  the whole batch of N, submitted together);
- tok/s: output tokens over wall time;
- steps/req: forward passes per request (jump-forward lowers it);
- step ms: wall time per scheduler step;
- mask ms: time per step filling and applying the grammar masks (all rows).
`--compact` generates JSON without whitespace
(--constrained-json-disable-any-whitespace), where more text is forced.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

CHARACTERS = [
    "Hermione Granger", "Harry Potter", "Severus Snape", "Luna Lovegood", "Albus Dumbledore",
    "Draco Malfoy", "Ron Weasley", "Minerva McGonagall", "Neville Longbottom", "Sirius Black",
    "Rubeus Hagrid", "Ginny Weasley", "Remus Lupin", "Bellatrix Lestrange", "Cedric Diggory",
    "Nymphadora Tonks", "Dobby",
]

REQUIRED_KEYS = ["name", "house", "blood status", "occupation", "wand", "alive", "patronus"]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "house": {"enum": ["Gryffindor", "Hufflepuff", "Ravenclaw", "Slytherin"]},
        "blood status": {"enum": ["Pure-blood", "Half-blood", "Muggle-born"]},
        "occupation": {"enum": ["student", "teacher", "auror", "ministry of magic",
                                "death eater", "order of the phoenix"]},
        "wand": {
            "type": "object",
            "properties": {
                "wood": {"type": "string", "maxLength": 16},
                "core": {"type": "string", "maxLength": 16},
                # NOTE: a string, not a number: a small model greedily repeats digits,
                # and outlines-core cannot bound an integer.
                "length": {"type": "string", "pattern": r"^[0-9]{1,2}(\.[0-9])? inches$"},
            },
            "required": ["wood", "core", "length"],
            "additionalProperties": False,
        },
        "alive": {"enum": ["Alive", "Deceased"]},
        "patronus": {"type": "string", "maxLength": 16},
    },
    "required": REQUIRED_KEYS,
    "additionalProperties": False,
}

MAX_NEW_TOKENS = 200


def prompt(name: str) -> str:
    return f"Give the character profile of {name} from Harry Potter, in JSON.\n"


def run_config(backend: str | None, jump_forward: bool, batch_sizes: list[int],
               num_batch1: int, compact: bool) -> dict[int, dict[str, float]]:
    from radixlm import Engine

    params: dict[str, Any] = {"temperature": 0.0, "max_new_tokens": MAX_NEW_TOKENS}
    if backend is not None:
        params["json_schema"] = json.dumps(SCHEMA)
    results = {}
    with Engine(grammar_backend=backend or "none", disable_jump_forward=not jump_forward,
                constrained_json_disable_any_whitespace=compact, log_level="warning",
                max_total_tokens=max(batch_sizes) * (MAX_NEW_TOKENS + 64),
                max_running_requests=max(batch_sizes)) as engine:
        engine.generate(prompt("Hedwig"), params)  # warm up (and wait for the backend)
        for bs in batch_sizes:
            before = engine.get_server_info()
            start = time.perf_counter()
            if bs == 1:
                outs = [engine.generate(prompt(CHARACTERS[i]), params) for i in range(num_batch1)]
                latency = (time.perf_counter() - start) / num_batch1
            else:
                names = [CHARACTERS[i % len(CHARACTERS)] for i in range(bs)]
                outs = engine.generate([prompt(n) for n in names], params)
                latency = time.perf_counter() - start
            elapsed = time.perf_counter() - start
            after = engine.get_server_info()
            if backend is not None:
                _check_valid(outs)
            results[bs] = _summarize(outs, elapsed, latency, before, after)
    return results


def _summarize(outs: list[dict], elapsed: float, latency: float,
               before: dict, after: dict) -> dict[str, float]:
    num_tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    num_steps = after["num_steps"] - before["num_steps"]
    num_mask_steps = after["num_grammar_mask_steps"] - before["num_grammar_mask_steps"]
    mask_s = after["grammar_mask_seconds_total"] - before["grammar_mask_seconds_total"]
    return {
        "latency": latency,
        "tok_s": num_tokens / elapsed,
        "steps_per_req": sum(o["meta_info"]["forward_steps"] for o in outs) / len(outs),
        "tokens_per_req": num_tokens / len(outs),
        "step_ms": 1000 * elapsed / max(num_steps, 1),
        "mask_ms": 1000 * mask_s / num_mask_steps if num_mask_steps else 0.0,
    }


def _check_valid(outs: list[dict]) -> None:
    for o in outs:
        if o["meta_info"]["finish_reason"]["type"] != "stop":
            print(f"  warning: output did not finish: {o['text'][:80]!r}...")
            continue
        data = json.loads(o["text"])
        missing = set(REQUIRED_KEYS) - set(data)
        if missing:
            raise AssertionError(f"output misses keys {missing}: {o['text']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["xgrammar", "outlines", "llguidance"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--num-batch1", type=int, default=3, help="requests timed at batch 1")
    parser.add_argument("--compact", action="store_true", help="JSON without whitespace")
    args = parser.parse_args()

    from radixlm.entrypoints.launch import prepare_environment

    prepare_environment()
    configs: list[tuple[str | None, bool]] = [(None, False)]
    configs += [(b, jf) for b in args.backends for jf in (False, True)]
    rows: list[tuple[str, int, dict[str, float]]] = []
    for backend, jf in configs:
        label = "unconstrained" if backend is None else f"{backend} jf={'on' if jf else 'off'}"
        print(f"running {label} ...", flush=True)
        results = run_config(backend, jf, args.batch_sizes, args.num_batch1, args.compact)
        rows.extend((label, bs, r) for bs, r in results.items())
    print(f"\nJSON character profiles, greedy, max_new_tokens={MAX_NEW_TOKENS}, "
          f"{'compact' if args.compact else 'default'} whitespace")
    print(f"{'config':<22} {'batch':>5} {'latency s':>9} {'tok/s':>7} {'tokens/req':>10} "
          f"{'steps/req':>9} {'step ms':>8} {'mask ms':>8}")
    for label, bs, r in rows:
        print(f"{label:<22} {bs:>5} {r['latency']:>9.2f} {r['tok_s']:>7.1f} "
              f"{r['tokens_per_req']:>10.1f} {r['steps_per_req']:>9.1f} {r['step_ms']:>8.1f} "
              f"{r['mask_ms']:>8.2f}")


if __name__ == "__main__":
    main()
