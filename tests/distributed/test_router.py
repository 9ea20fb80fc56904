"""SGLang's router (`sglang-router`) in front of two radixlm servers on loopback.

The router checks each worker (/health, /server_info or /get_server_info,
/model_info or /get_model_info), polls /get_load, and forwards /generate (with
SGLang's extra `log_metrics` field) and the OpenAI routes; /flush_cache goes to
every worker. 16 concurrent requests through it all complete, and both
servers serve some.
"""

from __future__ import annotations

import importlib.util
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from radixlm.bench.stream import build_tiny_llama

sys.path.insert(0, str(Path(__file__).parents[1] / "entrypoints"))
from _server_process import ServerProcess, free_port  # noqa: E402

if importlib.util.find_spec("sglang_router") is None:
    print("sglang-router is not installed (pip install sglang-router): router test skipped")
    pytest.skip("sglang-router is not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("router")
    model = str(build_tiny_llama(tmp / "tiny", context_len=2048))
    workers = [ServerProcess(tmp / f"w{i}.log", "--model-path", model, "--log-level", "debug")
               for i in range(2)]
    port = free_port()
    log = open(tmp / "router.log", "wb")  # noqa: SIM115 - closed below
    proc = None
    try:
        for w in workers:
            w.wait_healthy()
        proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
             "--port", str(port), "--prometheus-port", str(free_port()),
             "--policy", "round_robin", "--worker-urls",
             *[w.url for w in workers]], stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        _wait_router(url, proc, tmp / "router.log")
        yield url, workers
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()
        for w in workers:
            w.stop()
        shutil.rmtree(tmp / "tiny", ignore_errors=True)


def _wait_router(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            workers = httpx.get(url + "/workers", timeout=5).json()["workers"]
            if len(workers) == 2 and all(w["is_healthy"] for w in workers):
                return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    raise TimeoutError(log.read_text()[-3000:])


def _one(url: str, i: int) -> str:
    if i % 3 == 0:
        r = httpx.post(url + "/generate", timeout=120, json={
            "text": f"Request {i}:", "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
        assert r.status_code == 200, r.text
        assert r.json()["meta_info"]["completion_tokens"] == 8
        return "generate"
    if i % 3 == 1:
        r = httpx.post(url + "/v1/chat/completions", timeout=120, json={
            "model": "tiny", "max_tokens": 8,
            "messages": [{"role": "user", "content": f"Request {i}"}]})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1
        return "chat"
    r = httpx.post(url + "/v1/completions", timeout=120, json={
        "model": "tiny", "prompt": f"Request {i}:", "max_tokens": 8})
    assert r.status_code == 200, r.text
    return "completions"


def test_16_requests_through_the_router(router) -> None:  # type: ignore[no-untyped-def]
    url, workers = router
    with ThreadPoolExecutor(8) as pool:
        kinds = list(pool.map(lambda i: _one(url, i), range(16)))
    assert sorted(set(kinds)) == ["chat", "completions", "generate"]
    served = [w.log_tail(400_000).count('"POST /generate') + w.log_tail(400_000).count(
        '"POST /v1/') for w in workers]
    assert all(n > 0 for n in served), served  # round_robin: both servers served some
    for w in workers:  # no route the router asked answered 404 (its HTTP/2 "PRI *"
        # probe, which looks for a gRPC worker while a server still loads, aside)
        missing = [line for line in w.log_tail(400_000).splitlines()
                   if " 404 " in line and ('"GET /' in line or '"POST /' in line)]
        assert not missing, missing


def test_control_routes_through_the_router(router) -> None:  # type: ignore[no-untyped-def]
    url, _ = router
    flushed = httpx.post(url + "/flush_cache", timeout=30).json()
    assert flushed["workers_flushed"] == 2, flushed
    assert httpx.get(url + "/get_model_info", timeout=30).json()["is_generation"] is True
    assert httpx.get(url + "/v1/models", timeout=30).json()["data"]
    loads = httpx.get(url + "/get_loads", timeout=30).json()["workers"]
    assert len(loads) == 2 and all(w["load"] >= 0 for w in loads), loads
