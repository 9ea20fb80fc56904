"""Server life cycle with the default model: start-up logs and /health while loading, a
child process that dies (the server must fail fast and exit non-zero, not hang), and
kill -9 of the server (its children must not outlive it).

SIGTERM is checked by the shared server's teardown (see conftest.py).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import httpx
from _server_process import ServerProcess, child_pids, process_name

from radixlm.utils import PortArgs


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


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (exited, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_kill_9_with_requests_in_flight_leaves_no_process(tmp_path: Path) -> None:
    """Issue 9, finding 7: the scheduler used to outlive its parent, stuck at exit."""
    srv = ServerProcess(tmp_path / "server.log")
    try:
        srv.wait_healthy()
        _kill_9_while_streaming(srv)
    finally:
        srv.stop(signal.SIGKILL, timeout=1)


def _kill_9_while_streaming(srv: ServerProcess) -> None:
    children = child_pids(srv.proc.pid)
    names = [process_name(p) for p in children]
    assert sum("child_process scheduler" in n for n in names) == 1, names
    assert sum("child_process detokenizer" in n for n in names) == 1, names
    started = threading.Barrier(9, timeout=60)

    def stream() -> None:
        body = {"text": "Tell me a story.", "stream": True,
                "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
        try:
            with httpx.stream("POST", srv.url + "/generate", json=body, timeout=60) as r:
                for i, _ in enumerate(r.iter_lines()):
                    if i == 1:
                        started.wait()
        except (httpx.HTTPError, threading.BrokenBarrierError):
            pass  # the server died under it, as intended

    threads = [threading.Thread(target=stream) for _ in range(8)]
    for t in threads:
        t.start()
    started.wait()  # every stream has tokens flowing
    os.kill(srv.proc.pid, signal.SIGKILL)
    srv.proc.wait(5)
    deadline = time.monotonic() + 5
    while any(_running(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [(p, process_name(p)) for p in children if _running(p)]
    assert not left, f"still running 5 s after kill -9 of the server: {left}"
    for t in threads:
        t.join(10)
    # The IPC folder it could not remove goes when the next engine starts.
    stale = glob.glob(os.path.join(tempfile.gettempdir(), f"radixlm-ipc-{srv.proc.pid}-*"))
    assert len(stale) == 1, stale
    shutil.rmtree(PortArgs.create().folder)
    assert not os.path.exists(stale[0])
