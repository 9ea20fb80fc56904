"""A tensor-parallel rank other than 0: a process that follows rank 0's steps.

    join the group → load this rank's shard → size the KV pool with the others
    → loop: receive a message from rank 0
              step       write its slots into this rank's req_to_token copy, run the shard
              heartbeat  nothing (rank 0 is idle but alive)
              stop       exit 0

It has no sockets and no scheduler: rank 0 decides everything and broadcasts
it (step_sync.py). A lost rank 0 (a collective fails or times out) exits 1 with
the reason; the launcher's watchdog then stops the whole server. On a node
other than 0 (`--node-rank` > 0), entrypoints/launch.py's `run_worker_node`
starts this node's ranks and exits with the first failure.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from typing import TYPE_CHECKING

from radixlm.distributed.parallel_state import TPConfig, destroy_tp_group
from radixlm.server_args import ServerArgs
from radixlm.utils import configure_logging

if TYPE_CHECKING:
    from radixlm.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def run_tp_worker_process(server_args: ServerArgs, model_dir: str, tp: TPConfig) -> None:
    configure_logging(server_args.log_level, prefix=f"tp{tp.rank}")
    try:
        from radixlm.model_executor.model_runner import ModelRunner

        follow_steps(ModelRunner(server_args, model_dir, tp))
        logger.info("Rank 0 stopped; TP rank %d exits", tp.rank)
        destroy_tp_group()
        os._exit(0)
    except Exception as e:  # noqa: BLE001 - any failure ends this rank, loudly
        logger.error("TP rank %d failed (lost rank 0 or a collective timed out after %.0f s): "
                     "%s: %s\n%s", tp.rank, tp.timeout, type(e).__name__, e,
                     traceback.format_exc())
        sys.stderr.flush()
        os._exit(1)  # NOTE: not sys.exit: the process group's threads could block it


def follow_steps(runner: ModelRunner) -> None:
    """Run rank 0's steps on this rank's shard until rank 0 says stop.

    Raises when a collective fails or times out (rank 0 lost)."""
    from radixlm.distributed.step_sync import apply_rows, receive_message, write_step_slots

    table = runner.req_to_token_pool.req_to_token
    logger.info("TP rank %d ready", runner.tp_rank)
    while True:
        msg = receive_message()
        if msg.kind == "step":
            assert msg.step is not None and msg.rows is not None
            apply_rows(table, msg.rows)
            write_step_slots(table, msg.step)
            runner.forward_shard(msg.step)
        elif msg.kind == "stop":
            return
