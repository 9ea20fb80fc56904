"""Child processes started as `python -m radixlm.entrypoints.child_process`.

Not `multiprocessing`: its "spawn" start method re-imports the caller's main
script in every child, which breaks any user script without an
`if __name__ == "__main__"` guard. A fresh interpreter that reads its
(pickled) arguments from stdin has no such trap.

A child dies with its parent, however the parent dies (kill -9 included):
- a watchdog thread in the child exits it (os._exit, which nothing can block)
  within PARENT_POLL_INTERVAL of its parent's death;
- on Linux, when the parent started it from its main thread, the kernel also
  sends it SIGKILL at once (prctl PR_SET_PDEATHSIG). NOTE: the kernel sends that
  signal when the *thread* that started the child exits, so it is armed only
  for children started from the main thread, which lives as long as the process.
"""

from __future__ import annotations

import ctypes
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from typing import Any

logger = logging.getLogger(__name__)

PARENT_POLL_INTERVAL = 0.25  # seconds
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

TARGETS = {
    "scheduler": "radixlm.scheduler.process:run_scheduler_process",
    "detokenizer": "radixlm.detokenizer.detokenizer_manager:run_detokenizer_process",
    "tp_worker": "radixlm.distributed.worker:run_tp_worker_process",
    "dp_controller": "radixlm.distributed.dp_controller:run_dp_controller_process",
}


class ChildProcess:
    """A started child with the small part of the Process API the engine uses."""

    def __init__(self, kind: str, args: tuple[Any, ...], env: dict[str, str] | None = None) -> None:
        """env: variables to add to this process's environment for the child."""
        self.name = f"radixlm-{kind}"
        from_main = threading.current_thread() is threading.main_thread()
        self._popen = subprocess.Popen(
            [sys.executable, "-m", "radixlm.entrypoints.child_process", kind,
             str(os.getpid()), "1" if from_main else "0"],
            stdin=subprocess.PIPE,
            env={**os.environ, **env} if env else None,
        )
        assert self._popen.stdin is not None
        self._popen.stdin.write(pickle.dumps(args))
        self._popen.stdin.close()

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def exitcode(self) -> int | None:
        return self._popen.poll()

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def terminate(self) -> None:
        if self.is_alive():
            self._popen.terminate()

    def kill(self) -> None:
        if self.is_alive():
            self._popen.kill()

    def join(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            self._popen.wait(None if deadline is None else max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            pass


def die_with_parent(parent_pid: int, use_pdeathsig: bool) -> None:
    """Make this process exit when `parent_pid` (the process that started it) dies."""
    if use_pdeathsig and sys.platform == "linux":
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
                logger.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
        except OSError as e:
            logger.warning("No parent-death signal (%s); the watchdog thread remains", e)
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_INTERVAL)
        os._exit(1)  # NOTE: not sys.exit: atexit hooks and thread joins could hang

    threading.Thread(target=watch, name="radixlm-parent-watchdog", daemon=True).start()


def _main() -> None:
    import importlib

    kind, parent_pid, from_main = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    die_with_parent(parent_pid, from_main)
    module_name, func_name = TARGETS[kind].split(":")
    args = pickle.loads(sys.stdin.buffer.read())
    getattr(importlib.import_module(module_name), func_name)(*args)


if __name__ == "__main__":
    _main()
