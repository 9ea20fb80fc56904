"""Start and stop the engine's child processes (scheduler, detokenizer).

Shared by the offline Engine and the HTTP server: the caller runs the
TokenizerManager in its own event loop and passes `is_alive` to its watchdog.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable

from radixlm.entrypoints.child_process import ChildProcess
from radixlm.server_args import ServerArgs
from radixlm.utils import PortArgs

logger = logging.getLogger(__name__)


def prepare_environment() -> None:
    """Environment the children inherit; must be set before they import torch."""
    # NOTE: the scheduler's OpenMP threads sleep at barriers instead of spinning.
    # A server never has the cores to itself: its HTTP process, the
    # detokenizer and the clients run beside it, and one preempted thread makes
    # spinning siblings burn whole time slices. Measured on 2 busy cores, the
    # linear layers of a decode step at batch 32 took 96 ms passive against
    # 387 ms (up to 2,050 ms) spinning; on idle cores passive costs a wake-up
    # per op (up to ~20% of a step). OMP_WAIT_POLICY=ACTIVE in the environment
    # restores spinning for a machine the server has to itself.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def launch_children(args: ServerArgs) -> tuple[str, PortArgs, list[ChildProcess]]:
    """Resolve the model folder (converting a GGUF once) and start the children."""
    from radixlm.model_loader.default_model import resolve_model_dir

    model_dir = resolve_model_dir(args.model_path)
    ports, procs = start_children(args, model_dir)
    return model_dir, ports, procs


def start_children(args: ServerArgs, model_dir: str) -> tuple[PortArgs, list[ChildProcess]]:
    """Start the scheduler and the detokenizer on `model_dir`.

    NOTE: call it from the main thread where possible: only children started from
    it get the kernel's parent-death signal (see child_process.py).
    """
    prepare_environment()
    ports = PortArgs.create()
    procs = [ChildProcess(kind, (args, model_dir, ports)) for kind in ("scheduler", "detokenizer")]
    return ports, procs


def make_is_alive(procs: list[ChildProcess]) -> Callable[[], str | None]:
    def is_alive() -> str | None:
        for p in procs:
            if not p.is_alive():
                return f"The {p.name} process exited unexpectedly (exit code {p.exitcode})"
        return None

    return is_alive


def stop_children(procs: list[ChildProcess], ports: PortArgs | None, timeout: float = 5.0) -> None:
    """Terminate the children, kill what does not exit, remove the IPC folder."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout)
        if p.is_alive():
            logger.warning("Killing %s", p.name)
            p.kill()
            p.join(timeout)
    if ports is not None:
        shutil.rmtree(ports.folder, ignore_errors=True)
