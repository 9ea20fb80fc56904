"""Start and stop the engine's child processes (scheduler, detokenizer, TP ranks).

Shared by the offline Engine and the HTTP server: the caller runs the
TokenizerManager in its own event loop and passes `is_alive` to its watchdog,
which watches every child, each TP rank of this node included: a rank that
dies fails the server at once, without waiting for a collective's timeout.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable
from types import FrameType

from radixlm.distributed.parallel_state import TPConfig, check_tp_layout, free_loopback_addr
from radixlm.entrypoints.child_process import ChildProcess
from radixlm.model_executor.cpu_threads import openmp_env, spins
from radixlm.server_args import ServerArgs
from radixlm.utils import PortArgs, configure_logging

logger = logging.getLogger(__name__)


def prepare_environment() -> None:
    """Environment the children inherit; must be set before they import torch.

    The OpenMP wait policy is set per child instead (see child_env)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def child_env(args: ServerArgs, spin: bool = False) -> dict[str, str]:
    """A child's OpenMP wait policy (model_executor/cpu_threads.py): the processes that
    run the model (spin=True) spin where --thread-policy says so, every other one sleeps."""
    processes = args.dp_size * args.num_local_tp_ranks
    return openmp_env(spin and args.device == "cpu" and spins(args.thread_policy, processes))


def launch_children(args: ServerArgs) -> tuple[str, PortArgs, list[ChildProcess]]:
    """Resolve the model folder (converting a GGUF once), have the CPU kernels ready
    (a build, where one is needed, under no start-up timeout) and start the children."""
    from radixlm.layers.cpu_kernels import prepare_cpu_kernels
    from radixlm.model_loader.model_path import resolve_model_dir

    model_dir = resolve_model_dir(args.model_path)
    prepare_cpu_kernels(args.device)
    ports, procs = start_children(args, model_dir)
    return model_dir, ports, procs


def start_children(args: ServerArgs, model_dir: str) -> tuple[PortArgs, list[ChildProcess]]:
    """Start the scheduler and the detokenizer on `model_dir`.

    NOTE: call it from the main thread where possible: only children started from
    it get the kernel's parent-death signal (see child_process.py).
    """
    prepare_environment()
    check_model_layout(args, model_dir)
    ports = PortArgs.create()
    if args.dp_size > 1:
        return ports, _start_replicas(args, model_dir, ports)
    init_addr = args.dist_init_addr or free_loopback_addr()
    procs = [ChildProcess("scheduler", (args, model_dir, ports, tp_config(args, 0, init_addr)),
                          env=child_env(args, spin=True)),
             ChildProcess("detokenizer", (args, model_dir, ports), env=child_env(args))]
    try:
        procs += start_worker_ranks(args, model_dir, init_addr)
    except BaseException:
        stop_children(procs, ports)
        raise
    return ports, procs


def _start_replicas(args: ServerArgs, model_dir: str, ports: PortArgs) -> list[ChildProcess]:
    """--dp-size N: the DP controller at the scheduler's address, N schedulers (each with
    its TP ranks) behind it, one detokenizer; the cores split evenly between replicas."""
    folder = ports.folder
    replica_ports = [PortArgs(tokenizer_input=f"ipc://{folder}/dp-replies",
                              scheduler_input=f"ipc://{folder}/scheduler-{i}",
                              detokenizer_input=ports.detokenizer_input)
                     for i in range(args.dp_size)]
    if args.num_threads is None and args.device == "cpu":
        cores = len(os.sched_getaffinity(0)) or 1
        args = dataclasses.replace(args, num_threads=max(cores // (args.dp_size * args.tp_size), 1))
    procs = [ChildProcess("dp_controller", (args, model_dir, ports, replica_ports),
                          env=child_env(args)),
             ChildProcess("detokenizer", (args, model_dir, ports), env=child_env(args))]
    try:
        for i, rp in enumerate(replica_ports):
            addr = free_loopback_addr()
            proc = ChildProcess("scheduler", (args, model_dir, rp, tp_config(args, 0, addr), i),
                                env=child_env(args, spin=True))
            proc.name = f"radixlm-scheduler-{i}"
            procs.append(proc)
            procs += start_worker_ranks(args, model_dir, addr)
    except BaseException:
        stop_children(procs, ports)
        raise
    return procs


def check_model_layout(args: ServerArgs, model_dir: str) -> None:
    """Raise ValueError at start-up when --tp-size cannot split the model."""
    if args.tp_size > 1:
        from transformers import AutoConfig

        if args.is_embedding:
            raise ValueError("--tp-size > 1 serves generative models; not with --is-embedding")

        check_tp_layout(AutoConfig.from_pretrained(model_dir), args.tp_size)


def tp_config(args: ServerArgs, rank: int, init_addr: str) -> TPConfig | None:
    """Rank `rank`'s TPConfig; None without tensor parallelism."""
    if args.tp_size == 1:
        return None
    local = args.num_local_tp_ranks
    return TPConfig(rank=rank, size=args.tp_size, init_addr=init_addr,
                    backend="nccl" if args.device == "cuda" else "gloo",
                    timeout=args.dist_timeout, local_rank=rank % local, num_local_ranks=local)


def start_worker_ranks(args: ServerArgs, model_dir: str,
                       init_addr: str | None = None) -> list[ChildProcess]:
    """This node's TP ranks other than 0 (each its own process, see distributed/worker.py)."""
    if args.tp_size == 1:
        return []
    if args.node_rank > 0:
        check_model_layout(args, model_dir)
    prepare_environment()
    addr = init_addr or args.dist_init_addr
    assert addr is not None, "a node other than 0 needs --dist-init-addr"
    local = args.num_local_tp_ranks
    first = args.node_rank * local
    procs: list[ChildProcess] = []
    for rank in range(max(first, 1), first + local):
        proc = ChildProcess("tp_worker", (args, model_dir, tp_config(args, rank, addr)),
                            env=child_env(args, spin=True))
        proc.name = f"radixlm-tp{rank}"
        procs.append(proc)
    return procs


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


def run_worker_node(args: ServerArgs) -> int:
    """`radixlm serve --nnodes N --node-rank R` with R > 0: run this node's TP ranks until
    rank 0 stops them (0) or one fails (1). SIGTERM / SIGINT stop them (0)."""
    from radixlm.model_loader.model_path import resolve_model_dir

    configure_logging(args.log_level, prefix=f"node{args.node_rank}")
    model_dir = resolve_model_dir(args.model_path)
    procs = start_worker_ranks(args, model_dir)
    stopping = False

    def on_signal(sig: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    logger.info("Node %d runs TP ranks %s", args.node_rank, [p.name for p in procs])
    code = 0
    while not stopping:
        codes = [p.exitcode for p in procs]
        if any(c not in (None, 0) for c in codes):
            logger.error("A TP rank on node %d exited with code %s; stopping this node",
                         args.node_rank, [c for c in codes if c])
            code = 1
            break
        if all(c == 0 for c in codes):
            break
        time.sleep(0.2)
    stop_children(procs, None)
    return code
