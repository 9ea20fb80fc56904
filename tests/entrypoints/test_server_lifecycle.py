"""Server life cycle with the default model: start-up logs and /health while loading, and a
child process that dies (the server must fail fast and exit non-zero, not hang).

SIGTERM is checked by the shared server's teardown (see conftest.py).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
from _server_process import ServerProcess, child_pids, process_name


def test_child_death_makes_server_exit_nonzero(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "server.log", "--served-model-name", "smol")
    try:
        srv.wait_healthy()
        assert 503 in srv.health_seen, "expected 503 while the model loads"
        log = srv.log_tail(20000)
        assert "smol" in log and srv.url in log

        outcome: list[str] = []

        def long_request() -> None:
            try:
                r = httpx.post(srv.url + "/generate", timeout=60, json={
                    "text": "Hi", "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}})
                outcome.append(str(r.status_code))
            except httpx.HTTPError as e:
                outcome.append(type(e).__name__)

        t = threading.Thread(target=long_request)
        t.start()
        time.sleep(1.0)
        children = [p for p in child_pids(srv.proc.pid) if "scheduler" in process_name(p)]
        assert len(children) == 1, [process_name(p) for p in child_pids(srv.proc.pid)]
        os.kill(children[0], signal.SIGKILL)
        t.join(30)
        assert outcome == ["503"], outcome  # failed fast, did not hang
        assert srv.wait_exit(30) == 1, srv.log_tail()
        deadline = time.monotonic() + 10
        while srv.group_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not srv.group_alive(), "child processes outlived the server"
    finally:
        srv.stop(signal.SIGKILL, timeout=1)
