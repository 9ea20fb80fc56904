"""Streaming cost per token: does a long stream get slower per token as it grows?

    python -m radixlm.bench.stream [--num-tokens 3000] [--window 500]
                                   [--routes engine native openai] [--incremental-streaming-output]

Streams `--num-tokens` tokens (ignore_eos, logprobs with 5 top entries) from a
tiny random Llama (2 layers, hidden 64, the default model's tokenizer), so
the model's own cost is small and flat (one thread: no OpenMP spinning
against other work on the machine) and what is left is the streaming path: scheduler bookkeeping, detokenizer, TokenizerManager, and for the
server the HTTP route and its server-sent events. For each route it prints,
over the first and the last `--window` tokens, the wall time per streamed
token and the CPU time per token of each process (the front: the Engine's or
the server's own process; the scheduler; the detokenizer), with the ratio
last/first. A ratio near 1 means a token costs the same late in the stream
as early on. CPU times come from /proc and are far less disturbed by other
work on the machine than wall times.

Routes: `engine` (Engine.generate(stream=True)), `native` (POST /generate
with stream), `openai` (POST /v1/completions with stream and logprobs).
The server runs as a child process on a free loopback port. Engine chunks
and native events are cumulative (SGLang's format: the whole text, ids and
logprobs so far) unless `--incremental-streaming-output` is given; the
OpenAI stream always carries deltas.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

PROMPT = "Tell me a very long story about a lighthouse keeper."
TOP_LOGPROBS = 5
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class Mark(NamedTuple):
    num_tokens: int  # tokens streamed when the mark was taken
    wall: float  # perf_counter seconds
    cpu: dict[str, float]  # CPU seconds so far, per process role


def build_tiny_llama(path: Path, context_len: int) -> Path:
    """A random-weight 2-layer Llama with the default model's tokenizer, saved in `path`."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from radixlm.model_loader.model_path import resolve_model_dir

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir(None))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=context_len, tie_word_embeddings=True,
                         eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# ---------------------------------------------------------------- CPU time from /proc


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            kids.extend(int(k) for k in f.read().split())
    return kids


def _role(pid: int, front: int) -> str:
    if pid == front:
        return "front"
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        args = f.read().split(b"\0")
    return "scheduler" if b"scheduler" in args else "detokenizer" if b"detokenizer" in args \
        else "other"


def _cpu(front: int) -> dict[str, float]:
    """CPU seconds (user + system, all threads) of `front` and each of its children."""
    out: dict[str, float] = {}
    for pid in [front, *_children(front)]:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            role = _role(pid, front)
        except FileNotFoundError:
            continue
        out[role] = out.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    return out


class Marker:
    """Takes a Mark when the stream first reaches each of `at` tokens."""

    def __init__(self, front: int, at: list[int]) -> None:
        self.front = front
        self.todo = sorted(at)
        self.marks: list[Mark] = []

    def update(self, num_tokens: int) -> None:
        while self.todo and num_tokens >= self.todo[0]:
            self.todo.pop(0)
            self.marks.append(Mark(num_tokens, time.perf_counter(), _cpu(self.front)))


# ---------------------------------------------------------------- routes


def run_engine(model_dir: str, num_tokens: int, at: list[int],
               **engine_kwargs: Any) -> list[Mark]:
    from radixlm import Engine

    params = {"max_new_tokens": num_tokens, "ignore_eos": True, "temperature": 0.0}
    with Engine(model_path=model_dir, max_total_tokens=num_tokens + 256, num_threads=1,
                grammar_backend="none", **engine_kwargs) as engine:
        engine.generate("warm up", {"max_new_tokens": 4})
        marker = Marker(os.getpid(), at)
        for chunk in engine.generate(PROMPT, params, stream=True, return_logprob=True,
                                     top_logprobs_num=TOP_LOGPROBS):
            marker.update(chunk["meta_info"]["completion_tokens"])  # only cheap reads here
    return marker.marks


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sse(lines: Iterator[str]) -> Iterator[str]:
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            yield line[6:]


def run_server(model_dir: str, num_tokens: int, routes: list[str], flags: list[str],
               at: list[int]) -> dict[str, list[Mark]]:
    import httpx

    port = _free_port()
    cmd = [sys.executable, "-m", "radixlm.launch_server", "--model-path", model_dir,
           "--port", str(port), "--max-total-tokens", str(num_tokens + 256),
           "--grammar-backend", "none", "--num-threads", "1", "--log-level", "warning",
           *flags]
    proc = subprocess.Popen(cmd, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    results = {}
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError("the server exited during start-up")
            time.sleep(0.5)
        with httpx.Client(base_url=url, timeout=600) as client:
            client.post("/generate", json={"text": "warm up", "sampling_params": {
                "max_new_tokens": 4}})
            for route in routes:
                results[route] = _stream_route(client, route, num_tokens,
                                               Marker(proc.pid, at))
    finally:
        proc.terminate()
        proc.wait(30)
    return results


def _stream_route(client: Any, route: str, num_tokens: int, marker: Marker) -> list[Mark]:
    if route == "native":
        path, body = "/generate", {
            "text": PROMPT, "stream": True, "return_logprob": True,
            "top_logprobs_num": TOP_LOGPROBS,
            "sampling_params": {"max_new_tokens": num_tokens, "ignore_eos": True,
                                "temperature": 0.0}}
    else:
        path, body = "/v1/completions", {
            "model": "m", "prompt": PROMPT, "stream": True, "max_tokens": num_tokens,
            "logprobs": TOP_LOGPROBS, "temperature": 0.0, "ignore_eos": True}
    count = 0
    with client.stream("POST", path, json=body) as r:
        for data in _sse(r.iter_lines()):
            # NOTE: no full JSON parse of a native event: the client would be what is
            # measured (its events are cumulative unless --incremental-streaming-output).
            if route == "native":
                at = data.rindex('"completion_tokens":') + len('"completion_tokens":')
                count = int(data[at : data.index(",", at)])
            elif '"text_offset"' in data:
                count += len(json.loads(data)["choices"][0]["logprobs"]["tokens"])
            marker.update(count)
    return marker.marks


# ---------------------------------------------------------------- report


def _per_token(a: Mark, b: Mark) -> tuple[float, dict[str, float]]:
    """ms per token between two marks: wall, and CPU per process role."""
    n = max(b.num_tokens - a.num_tokens, 1)
    cpu = {role: (b.cpu.get(role, 0.0) - a.cpu.get(role, 0.0)) * 1000 / n for role in b.cpu}
    return (b.wall - a.wall) * 1000 / n, cpu


def report(results: dict[str, list[Mark]], n: int, w: int, mode: str) -> None:
    print(f"{n}-token stream, logprobs with top {TOP_LOGPROBS}, {mode} Engine/native events:"
          f" ms per token over the first and the last {w} tokens (last/first)")
    roles = ["front", "scheduler", "detokenizer"]
    print(f"{'route':8} {'wall':>22} " + " ".join(f"{'cpu ' + r:>24}" for r in roles))
    for route, marks in results.items():
        first_wall, first_cpu = _per_token(marks[0], marks[1])
        last_wall, last_cpu = _per_token(marks[2], marks[3])

        def cell(a: float, b: float) -> str:
            return f"{a:7.3f} -> {b:7.3f} ({b / a if a else float('nan'):4.2f})"

        print(f"{route:8} {cell(first_wall, last_wall):>22} " + " ".join(
            f"{cell(first_cpu.get(r, 0.0), last_cpu.get(r, 0.0)):>24}" for r in roles))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-tokens", type=int, default=3000)
    parser.add_argument("--window", type=int, default=500)
    parser.add_argument("--routes", nargs="+", default=["engine", "native", "openai"],
                        choices=["engine", "native", "openai"])
    parser.add_argument("--incremental-streaming-output", action="store_true",
                        help="Engine chunks and native events carry only what is new.")
    args = parser.parse_args()
    n, w = args.num_tokens, args.window
    incremental = args.incremental_streaming_output
    at = [1, w + 1, n - w, n]  # the first window starts after the first token arrived
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    results: dict[str, list[Mark]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_tiny_llama(Path(tmp), context_len=n + 1024))
        if "engine" in args.routes:
            kwargs = {"incremental_streaming_output": True} if incremental else {}
            results["engine"] = run_engine(model_dir, n, at, **kwargs)
        http_routes = [r for r in args.routes if r != "engine"]
        if http_routes:
            flags = ["--incremental-streaming-output"] if incremental else []
            results.update(run_server(model_dir, n, http_routes, flags, at))
    report(results, n, w, "incremental" if incremental else "cumulative")


if __name__ == "__main__":
    main()
