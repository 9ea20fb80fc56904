"""Run the real server (`python -m radixlm.launch_server`) as a subprocess for tests.

The server runs in its own session (process group), so the test can check that
every child process is gone after shutdown and kill the whole group if not.
Its output goes to a log file whose tail is shown when start-up fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

API_KEY = "sk-radixlm-test"  # the shared test server's --api-key
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie leader (not reaped yet) still counts; the caller waits on it first.
    return True


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid` (Linux /proc)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out.extend(int(x) for x in f.read().split())
    return out


def process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class ServerProcess:
    def __init__(self, log_path: Path, *flags: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.health_seen: list[int] = []
        cmd = [sys.executable, "-m", "radixlm.launch_server", "--port", str(self.port),
               "--max-total-tokens", "8192", *flags]
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def log_tail(self, n: int = 4000) -> str:
        return self.log_path.read_bytes()[-n:].decode(errors="replace")

    def wait_healthy(self, timeout: float = 300.0) -> None:
        """Wait for /health 200, recording the statuses seen before (in `health_seen`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                status = httpx.get(self.url + "/health", timeout=5).status_code
                self.health_seen.append(status)
                if status == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"server not healthy after {timeout:.0f} s:\n{self.log_tail()}")

    def wait_exit(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def group_alive(self) -> bool:
        return _group_alive(self.proc.pid)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        """Send `sig`, wait for the exit; kill the whole group if anything is left."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.wait_exit(timeout)
        deadline = time.monotonic() + 10
        while self.group_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.proc.poll() is None or self.group_alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._log.close()
        return code


@contextlib.contextmanager
def running_server(log_path: Path, *flags: str) -> Iterator[ServerProcess]:
    """A server started with `flags` and healthy; stopped (SIGTERM) however the block ends."""
    srv = ServerProcess(log_path, *flags)
    try:
        srv.wait_healthy()
        yield srv
    finally:
        srv.stop()
