"""Serving benchmark for any OpenAI-compatible server (radixlm, vLLM, llama.cpp, SGLang).

    python -m radixlm.bench.serving --base-url http://127.0.0.1:30000 --concurrency 1 16 32
    python -m radixlm.bench.serving --base-url URL --dataset random --random-input-len 2000 \\
        --output-len 1 --concurrency 1 --num-prompts 3
    python -m radixlm.bench.serving --base-url URL --request-rate 8 --num-prompts 64
    python -m radixlm.bench.serving --plot out.png --plot-from a.jsonl b.jsonl

It builds its workload itself (nothing is downloaded): `builtin` chat prompts
of ~40 tokens, or `random` prompts of about `--random-input-len` tokens, each
asking for `--output-len` tokens (`ignore_eos` where the server honours it).
Requests stream through `/v1/chat/completions` (or `/v1/completions` with
`--endpoint completions`), either at a fixed concurrency (each level of
`--concurrency` is one run) or arriving as a Poisson process at
`--request-rate` per second. Per run it reports TTFT, TPOT (time per output
token after the first), ITL (gaps between streamed chunks), each as mean,
p50 and p99, and request, output-token and total-token throughput; it prints
the CPU it ran on. `--repeat N` runs each level N times and prints how much
their output throughput varies (range, largest deviation from the median, CV).
`--output-file` appends one JSON line per run; `--plot`
draws output throughput and latency against concurrency for every server in
this run and in `--plot-from` files, side by side (needs matplotlib).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

BUILTIN_PROMPTS = [
    "Explain in a few sentences why the sky looks blue during the day.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "What are three practical tips for learning a new language as an adult?",
    "Describe how a bicycle gear system works to someone who has never seen one.",
    "Give me a simple recipe for vegetable soup and explain each step.",
    "Why do leaves change color in autumn? Answer for a ten-year-old.",
    "Summarize the main causes of the French Revolution in plain words.",
    "What is the difference between weather and climate? Give examples.",
    "Write a friendly email inviting a colleague to a team lunch next week.",
    "How does a refrigerator keep food cold? Explain the cycle briefly.",
    "List some good habits for writing clean and readable computer code.",
    "Tell me about the life cycle of a butterfly from egg to adult.",
    "What should a beginner know before planting a small vegetable garden?",
    "Explain what a prime number is and give a few examples of them.",
    "Describe a calm morning in a small mountain village in a paragraph.",
    "What are the benefits of regular walking for health and mood?",
]

_WORDS = (
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend father "
    "power hour game line end member law car city community name president team minute idea"
).split()


@dataclass
class RequestResult:
    ok: bool
    ttft: float = 0.0  # seconds to the first content chunk
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)  # gaps between content chunks
    output_tokens: int = 0
    prompt_tokens: int = 0
    error: str = ""


@dataclass
class RunResult:
    label: str
    base_url: str
    concurrency: int | None
    request_rate: float | None
    num_requests: int
    num_failed: int
    duration: float
    request_throughput: float
    output_throughput: float  # output tokens / s, all requests together
    total_throughput: float  # (prompt + output) tokens / s
    mean_input_tokens: float
    mean_output_tokens: float
    ttft: dict[str, float]
    tpot: dict[str, float]
    itl: dict[str, float]
    cpu: str


def cpu_description() -> str:
    """The CPU model, its core count and the instruction sets that pick kernels."""
    name = platform.processor() or "unknown CPU"
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and name in ("unknown CPU", "", "x86_64"):
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass


    wanted = ["avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8"]
    isa = "+".join(f for f in wanted if f in flags) or "no AVX2"
    return f"{name}, {os.cpu_count()} cores, {isa}"


def build_prompts(args: argparse.Namespace) -> list[str]:
    rng = random.Random(args.seed)
    if args.dataset == "builtin":
        return [BUILTIN_PROMPTS[i % len(BUILTIN_PROMPTS)] for i in range(args.num_prompts)]
    prompts = []
    for i in range(args.num_prompts):
        # NOTE: a leading unique number keeps prefix caches from sharing whole prompts.
        words = [rng.choice(_WORDS) for _ in range(max(args.random_input_len - 4, 1))]
        prompts.append(f"{i} " + " ".join(words))
    return prompts


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0}
    ordered = sorted(values)

    def pct(p: float) -> float:
        return ordered[min(int(round(p / 100 * (len(ordered) - 1))), len(ordered) - 1)]

    return {"mean": statistics.fmean(values), "p50": pct(50), "p99": pct(99)}


async def _one_request(client: Any, args: argparse.Namespace, prompt: str) -> RequestResult:
    body: dict[str, Any] = {
        "model": args.model,
        "max_tokens": args.output_len,
        "temperature": args.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if not args.no_ignore_eos:
        body["ignore_eos"] = True
    if args.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        url = "/v1/chat/completions"
    else:
        body["prompt"] = prompt
        url = "/v1/completions"
    result = RequestResult(ok=False)
    start = last = time.perf_counter()
    num_chunks = 0
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                result.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("usage"):
                    result.output_tokens = int(chunk["usage"].get("completion_tokens") or 0)
                    result.prompt_tokens = int(chunk["usage"].get("prompt_tokens") or 0)
                choices = chunk.get("choices") or []
                text = ""
                if choices:
                    delta = choices[0].get("delta") or {}
                    text = delta.get("content") or choices[0].get("text") or ""
                if not text:
                    continue
                now = time.perf_counter()
                if num_chunks == 0:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last)
                last = now
                num_chunks += 1
    except Exception as e:  # noqa: BLE001 - a failed request is counted, not fatal
        result.error = f"{type(e).__name__}: {e}"
        return result
    result.latency = time.perf_counter() - start
    result.output_tokens = result.output_tokens or num_chunks  # servers without usage
    result.ok = num_chunks > 0 or args.output_len == 0
    return result


async def _run(args: argparse.Namespace, base_url: str, prompts: list[str],
               concurrency: int | None) -> tuple[list[RequestResult], float]:
    import httpx
    from tqdm.asyncio import tqdm

    limit = concurrency or len(prompts)
    semaphore = asyncio.Semaphore(limit)
    rng = random.Random(args.seed)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    timeout = httpx.Timeout(args.timeout)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout, headers=headers,
                                 limits=httpx.Limits(max_connections=limit + 4)) as client:
        bar = tqdm(total=len(prompts), desc=f"c={concurrency or '-'}", leave=False,
                   disable=args.disable_tqdm)

        async def guarded(prompt: str) -> RequestResult:
            async with semaphore:
                out = await _one_request(client, args, prompt)
            bar.update(1)
            return out

        start = time.perf_counter()
        tasks = []
        for prompt in prompts:
            tasks.append(asyncio.create_task(guarded(prompt)))
            if args.request_rate:
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
        bar.close()
    return list(results), duration


def summarize(args: argparse.Namespace, label: str, base_url: str, concurrency: int | None,
              results: list[RequestResult], duration: float) -> RunResult:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    return RunResult(
        label=label, base_url=base_url, concurrency=concurrency,
        request_rate=args.request_rate, num_requests=len(results),
        num_failed=len(results) - len(ok), duration=duration,
        request_throughput=len(ok) / duration, output_throughput=out_tokens / duration,
        total_throughput=(out_tokens + in_tokens) / duration,
        mean_input_tokens=in_tokens / max(len(ok), 1),
        mean_output_tokens=out_tokens / max(len(ok), 1),
        ttft=_stats([r.ttft for r in ok]), tpot=_stats(tpot),
        itl=_stats([gap for r in ok for gap in r.itl]), cpu=cpu_description(),
    )


def print_run(run: RunResult, errors: list[str]) -> None:
    mode = f"concurrency {run.concurrency}" if run.concurrency else f"rate {run.request_rate}/s"
    print(f"\n== {run.label} ({run.base_url}), {mode} ==")
    print(f"requests: {run.num_requests - run.num_failed} ok, {run.num_failed} failed, "
          f"{run.duration:.2f} s; mean input {run.mean_input_tokens:.0f}, "
          f"output {run.mean_output_tokens:.0f} tokens")
    print(f"throughput: {run.request_throughput:.2f} req/s, {run.output_throughput:.1f} "
          f"output tok/s, {run.total_throughput:.1f} total tok/s")
    for name in ("ttft", "tpot", "itl"):
        s = getattr(run, name)
        print(f"{name.upper():>5} ms: mean {s['mean'] * 1e3:8.1f}  p50 {s['p50'] * 1e3:8.1f}  "
              f"p99 {s['p99'] * 1e3:8.1f}")
    for e in errors[:3]:
        print(f"  error: {e}")


def spread(runs: list[RunResult]) -> dict[str, float]:
    """How much the output throughput of repeated runs of one workload varies: mean,
    median, min, max, the range as a share of the median, the largest deviation from
    the median and the coefficient of variation (stdev / mean), the last three in %."""
    xs = [r.output_throughput for r in runs]
    median = statistics.median(xs)
    mean = statistics.fmean(xs)
    return {
        "runs": len(xs), "mean": mean, "median": median, "min": min(xs), "max": max(xs),
        "range_pct": 100 * (max(xs) - min(xs)) / median,
        "max_dev_pct": 100 * max(abs(x - median) for x in xs) / median,
        "cv_pct": 100 * statistics.pstdev(xs) / mean,
    }


def print_spread(runs: list[RunResult]) -> None:
    s = spread(runs)
    print(f"spread over {s['runs']} runs: output tok/s median {s['median']:.1f} "
          f"(min {s['min']:.1f}, max {s['max']:.1f}); range {s['range_pct']:.1f}% of the "
          f"median, largest deviation {s['max_dev_pct']:.1f}%, CV {s['cv_pct']:.1f}%")


def plotted_runs(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The fixed-concurrency runs by server label, leaving out runs whose every request
    failed (a server that died is no data point)."""
    by_label: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        if run.get("concurrency") and run.get("num_failed", 0) < run.get("num_requests", 1):
            by_label.setdefault(run["label"], []).append(run)
    return by_label


def plot(runs: list[dict[str, Any]], path: str) -> None:
    """Output tok/s and median TTFT / ITL against concurrency, one line per server
    (runs where every request failed left out)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib") from e
    by_label = plotted_runs(runs)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    panels = [("output_throughput", None, "output tokens/s"), ("ttft", "p50", "TTFT p50 (ms)"),
              ("itl", "p50", "ITL p50 (ms)")]
    for label, items in sorted(by_label.items()):
        xs = sorted({r["concurrency"] for r in items})
        for ax, (key, sub, _) in zip(axes, panels):
            # --repeat runs of one level: their median, so the line does not zig-zag.
            ys = [statistics.median(r[key] if sub is None else r[key][sub] * 1e3
                                    for r in items if r["concurrency"] == x) for x in xs]
            ax.plot(xs, ys, marker="o", label=label)
    for ax, (_, _, title) in zip(axes, panels):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    axes[0].legend()
    cpu = runs[0]["cpu"] if runs else ""
    fig.suptitle(f"bench_serving on {cpu}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", nargs="*", default=[], help="Server(s), one after another.")
    p.add_argument("--label", nargs="*", default=[], help="A name per --base-url.")
    p.add_argument("--model", default="default", help="The model field of each request.")
    p.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    p.add_argument("--dataset", choices=["builtin", "random"], default="builtin")
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-prompts", type=int, default=None,
                   help="Requests per run (default: 2 x concurrency, at least 8).")
    p.add_argument("--concurrency", type=int, nargs="*", default=[1],
                   help="Concurrency levels; each is one run.")
    p.add_argument("--request-rate", type=float, default=None,
                   help="Poisson arrivals per second instead of fixed concurrency.")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--no-ignore-eos", action="store_true",
                   help="Let requests stop at EOS instead of asking for ignore_eos.")
    p.add_argument("--warmup", type=int, default=1, help="Requests sent before each server.")
    p.add_argument("--repeat", type=int, default=1,
                   help="Runs per concurrency level; above 1 it prints how much they vary.")
    p.add_argument("--api-key", default=None)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-file", default=None, help="Append one JSON line per run.")
    p.add_argument("--plot", default=None, help="Write a PNG of throughput and latency.")
    p.add_argument("--plot-from", nargs="*", default=[], help="Earlier --output-file files.")
    p.add_argument("--disable-tqdm", action="store_true")
    args = p.parse_args(argv)
    if args.label and len(args.label) != len(args.base_url):
        p.error("give one --label per --base-url")
    if not args.base_url and not (args.plot and args.plot_from):
        p.error("give --base-url, or --plot with --plot-from")
    if args.output_len < 1 or any(c < 1 for c in args.concurrency):
        p.error("--output-len and --concurrency must be at least 1")
    return args


def main(argv: list[str] | None = None) -> list[RunResult]:
    args = parse_args(argv)
    print(f"CPU: {cpu_description()}")
    runs: list[RunResult] = []
    levels: list[int | None] = [None] if args.request_rate else list(args.concurrency)
    for i, base_url in enumerate(args.base_url):
        base_url = base_url.rstrip("/").removesuffix("/v1")
        label = args.label[i] if args.label else base_url
        if args.warmup:
            warm = argparse.Namespace(**{**vars(args), "num_prompts": args.warmup})
            asyncio.run(_run(warm, base_url, build_prompts(warm), 1))
        for level in levels:
            num = args.num_prompts or max(2 * (level or 1), 8)
            prompts = build_prompts(argparse.Namespace(**{**vars(args), "num_prompts": num}))
            repeats: list[RunResult] = []
            for _ in range(args.repeat):
                results, duration = asyncio.run(_run(args, base_url, prompts, level))
                run = summarize(args, label, base_url, level, results, duration)
                print_run(run, [r.error for r in results if not r.ok])
                repeats.append(run)
                if args.output_file:
                    with open(args.output_file, "a") as f:
                        f.write(json.dumps(asdict(run)) + "\n")
            if len(repeats) > 1:
                print_spread(repeats)
            runs += repeats
    if args.plot:
        everything = [asdict(r) for r in runs]
        for path in args.plot_from:
            with open(path) as f:
                everything += [json.loads(line) for line in f if line.strip()]
        plot(everything, args.plot)
    return runs


if __name__ == "__main__":
    main()
