"""Child processes started as `python -m radixlm.entrypoints.child_process`.

Not `multiprocessing`: its "spawn" start method re-imports the caller's main
script in every child, which breaks any user script without an
`if __name__ == "__main__"` guard. A fresh interpreter that reads its
(pickled) arguments from stdin has no such trap.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import time
from typing import Any

TARGETS = {
    "scheduler": "radixlm.scheduler.process:run_scheduler_process",
    "detokenizer": "radixlm.detokenizer.detokenizer_manager:run_detokenizer_process",
}


class ChildProcess:
    """A started child with the small part of the Process API the engine uses."""

    def __init__(self, kind: str, args: tuple[Any, ...]) -> None:
        self.name = f"radixlm-{kind}"
        self._popen = subprocess.Popen(
            [sys.executable, "-m", "radixlm.entrypoints.child_process", kind],
            stdin=subprocess.PIPE,
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


def _main() -> None:
    import importlib

    kind = sys.argv[1]
    module_name, func_name = TARGETS[kind].split(":")
    args = pickle.loads(sys.stdin.buffer.read())
    getattr(importlib.import_module(module_name), func_name)(*args)


if __name__ == "__main__":
    _main()
