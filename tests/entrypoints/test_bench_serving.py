"""bench_serving against the real HTTP app over a real socket (fake runtime, no model):
fixed concurrency and request-rate runs, the metrics it reports, JSONL results and the plot."""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import uvicorn
from _fake_runtime import FakeTokenizerManager, byte_tokenizer, fake_starter

from radixlm.bench import serving as bench_serving
from radixlm.entrypoints.http.server import create_app
from radixlm.server_args import ServerArgs


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tm = FakeTokenizerManager(byte_tokenizer(), context_length=4096, delay=0.002)
    app = create_app(ServerArgs(served_model_name="fake-model"), fake_starter(tm))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "fake server did not start"
        time.sleep(0.05)
    yield url
    server.should_exit = True
    thread.join(10)


def test_concurrency_sweep_reports_and_plots(base_url: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "runs.jsonl"
    png = tmp_path / "out.png"
    runs = bench_serving.main([
        "--base-url", base_url, "--label", "fake", "--concurrency", "1", "4",
        "--num-prompts", "8", "--output-len", "12", "--output-file", str(results),
        "--plot", str(png), "--disable-tqdm",
    ])
    assert [r.concurrency for r in runs] == [1, 4]
    for run in runs:
        assert run.num_failed == 0 and run.num_requests == 8
        assert run.mean_output_tokens == 12  # usage from the final chunk
        assert run.mean_input_tokens > 10
        assert 0 < run.ttft["p50"] <= run.ttft["p99"]
        assert run.itl["mean"] > 0 and run.tpot["mean"] > 0
        assert run.output_throughput > 0 and run.request_throughput > 0
    assert runs[1].output_throughput > runs[0].output_throughput  # 4 streams beat one
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert [line["concurrency"] for line in lines] == [1, 4]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "CPU: " in out and "TTFT ms" in out and "output tok/s" in out

    # A plot from saved results alone, two "servers" side by side.
    again = tmp_path / "again.png"
    lines[0]["label"] = lines[1]["label"] = "other"
    other = tmp_path / "other.jsonl"
    other.write_text("\n".join(json.dumps(line) for line in lines))
    bench_serving.main(["--plot", str(again), "--plot-from", str(results), str(other)])
    assert again.stat().st_size > 0


def test_request_rate_and_random_prompts(base_url: str) -> None:
    (run,) = bench_serving.main([
        "--base-url", base_url, "--request-rate", "50", "--num-prompts", "6",
        "--dataset", "random", "--random-input-len", "64", "--output-len", "4",
        "--endpoint", "completions", "--disable-tqdm",
    ])
    assert run.concurrency is None and run.request_rate == 50
    assert run.num_failed == 0 and run.mean_output_tokens == 4
    assert run.mean_input_tokens > 64  # the fake tokenizer has one token per byte


def test_failed_requests_are_counted(base_url: str) -> None:
    (run,) = bench_serving.main([
        "--base-url", base_url, "--concurrency", "2", "--num-prompts", "2",
        "--output-len", "100000", "--warmup", "0", "--disable-tqdm",
    ])
    assert run.num_failed == 2  # max_tokens past the context: a 400 for each
    # ... and such a run is left out of the plot, beside one of another server that ran.
    ok = {**asdict(run), "label": "alive", "num_failed": 0}
    assert bench_serving.plotted_runs([asdict(run), ok]) == {"alive": [ok]}


def test_bad_arguments_exit() -> None:
    with pytest.raises(SystemExit):
        bench_serving.parse_args(["--base-url", "http://x", "--label", "a", "b"])
    with pytest.raises(SystemExit):
        bench_serving.parse_args([])


def test_repeat_prints_how_much_runs_vary(base_url: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    runs = bench_serving.main([
        "--base-url", base_url, "--concurrency", "2", "--num-prompts", "4",
        "--output-len", "4", "--repeat", "3", "--warmup", "0", "--disable-tqdm",
    ])
    assert len(runs) == 3 and all(r.num_failed == 0 for r in runs)
    assert "spread over 3 runs: output tok/s median" in capsys.readouterr().out
    # The figures themselves, on known throughputs: median 100, range 20 (90..110).
    fake = [SimpleNamespace(output_throughput=x) for x in (90.0, 100.0, 110.0, 104.0, 96.0)]
    s = bench_serving.spread(fake)  # type: ignore[arg-type]
    assert s["median"] == 100 and s["min"] == 90 and s["max"] == 110
    assert s["range_pct"] == pytest.approx(20) and s["max_dev_pct"] == pytest.approx(10)
    assert s["cv_pct"] == pytest.approx(100 * statistics.pstdev([90, 100, 110, 104, 96]) / 100)
