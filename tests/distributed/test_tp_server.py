"""The HTTP server with TP ranks: a killed rank fails the server fast; two "nodes".

- `--tp-size 2` on one node, a client streaming: SIGKILL the rank-1 process; the
  client gets an error (not a hang) and the server exits 1 within a bound.
- `--nnodes 2`: node 0 (`--node-rank 0`, HTTP and rank 0) and node 1 (`--node-rank 1`,
  rank 1 only) on 127.0.0.1 meet at `--dist-init-addr` and serve requests; stopping
  node 0 stops node 1 (exit 0).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from radixlm.bench.stream import build_tiny_llama
from radixlm.distributed.parallel_state import free_loopback_addr

sys.path.insert(0, str(Path(__file__).parents[1] / "entrypoints"))
from _server_process import ServerProcess, child_pids, process_name  # noqa: E402

EXIT_BOUND = 30.0  # seconds from the kill to the server's exit
GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny_llama"), context_len=4096))


def _generate(url: str, text: str = "The capital of France is") -> list[int]:
    r = httpx.post(url + "/generate", timeout=120, json={"text": text, "sampling_params": GREEDY})
    assert r.status_code == 200, r.text
    return list(r.json()["output_ids"])


def test_killed_rank_fails_the_server(tiny_model: str, tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "server.log", "--model-path", tiny_model, "--tp-size", "2",
                        "--dist-timeout", "20")
    try:
        srv.wait_healthy()
        assert len(_generate(srv.url)) == 8
        outcome: list[str] = []

        def long_request() -> None:
            try:
                with httpx.stream("POST", srv.url + "/generate", timeout=60, json={
                        "text": "Hi", "stream": True,
                        "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}) as r:
                    body = "".join(r.iter_text())
                outcome.append(f"{r.status_code} {'error' in body}")
            except httpx.HTTPError as e:
                outcome.append(type(e).__name__)

        t = threading.Thread(target=long_request)
        t.start()
        time.sleep(1.0)
        ranks = [p for p in child_pids(srv.proc.pid) if "tp_worker" in process_name(p)]
        assert len(ranks) == 1, [process_name(p) for p in child_pids(srv.proc.pid)]
        killed_at = time.monotonic()
        os.kill(ranks[0], signal.SIGKILL)
        code = srv.wait_exit(EXIT_BOUND)
        assert code == 1, f"exit code {code} after {time.monotonic() - killed_at:.1f} s"
        t.join(30)
        assert not t.is_alive(), "the client hung"
        assert outcome and outcome[0] != "200 False", outcome  # an error, not a clean end
        assert "radixlm-tp1" in srv.log_tail(20000)  # the log names the rank that died
    finally:
        srv.stop(signal.SIGKILL, timeout=1)


def test_two_nodes_serve_a_request(tiny_model: str, tmp_path: Path) -> None:
    addr = free_loopback_addr()
    flags = ["--model-path", tiny_model, "--tp-size", "2", "--nnodes", "2",
             "--dist-init-addr", addr, "--dist-timeout", "30"]
    node1_log = open(tmp_path / "node1.log", "wb")  # noqa: SIM115
    node1 = subprocess.Popen([sys.executable, "-m", "radixlm.launch_server", *flags,
                              "--node-rank", "1"], stdout=node1_log, stderr=subprocess.STDOUT)
    node0 = ServerProcess(tmp_path / "node0.log", *flags, "--node-rank", "0")
    try:
        node0.wait_healthy()
        # (TP=2 equals TP=1 is test_tp_logits' and test_tp_engine's; here: it serves, alike)
        first = _generate(node0.url)
        assert len(first) == 8 and _generate(node0.url) == first
        assert node0.stop() == 0
        assert node1.wait(30) == 0, (tmp_path / "node1.log").read_text()[-3000:]
    finally:
        node0.stop(signal.SIGKILL, timeout=1)
        if node1.poll() is None:
            node1.kill()
            node1.wait(10)
        node1_log.close()
