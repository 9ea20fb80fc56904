"""The scheduler process: ZMQ in, steps, ZMQ out.

The loop blocks on its input socket only when it has no work, so an idle
server costs nothing and a busy one never waits for a message. It exits when
its parent dies, and reports any exception to the TokenizerManager before
exiting non-zero.

With tensor parallelism this is rank 0: its runner broadcasts each step to the
other ranks, and the idle loop sends them heartbeats (see distributed/).

`RADIXLM_CHECK_INTEGRITY=N` (the tests set it) runs the KV accounting check
every N steps and whenever the scheduler goes idle; a failed check is a
scheduler failure like any other.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import traceback
from typing import TYPE_CHECKING, Any, Protocol

import zmq

from radixlm.distributed.parallel_state import TPConfig
from radixlm.messages.io_struct import (
    AbortReq,
    BatchEmbeddingOut,
    BatchTokenIDOut,
    EmbeddingOut,
    FinishReason,
    FlushCacheReq,
    GetServerInfoReq,
    ProcessError,
    ProfileReq,
    ReplicaLoad,
    SchedulerReady,
    TokenizedGenerateReq,
    TokenOut,
    UpdateWeightsFromDiskReq,
)
from radixlm.scheduler import control
from radixlm.server_args import ServerArgs
from radixlm.utils import PortArgs, configure_logging, parent_alive

if TYPE_CHECKING:
    from radixlm.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)

_STOP = threading.Event()  # set by SIGTERM when the scheduler has TP ranks to stop


class _Sender(Protocol):
    def send_pyobj(self, obj: Any) -> Any: ...


class _ReplicaSender:
    """A data-parallel replica's replies, tagged with its index for the DP controller."""

    def __init__(self, sock: zmq.Socket[bytes], dp_rank: int) -> None:
        self.sock, self.dp_rank = sock, dp_rank
        self.num_received = 0  # generate requests received (the controller's load count)
        self._last_load: tuple[int, int] | None = None

    def send_pyobj(self, obj: Any) -> Any:
        return self.sock.send_pyobj((self.dp_rank, obj))

    def report_load(self, scheduler: Scheduler) -> None:
        load = (self.num_received, len(scheduler.running) + len(scheduler.waiting))
        if load != self._last_load:
            self._last_load = load
            self.send_pyobj(ReplicaLoad(self.dp_rank, *load))


def run_scheduler_process(server_args: ServerArgs, model_dir: str, ports: PortArgs,
                          tp: TPConfig | None = None, dp_rank: int | None = None) -> None:
    """dp_rank: this replica's index with --dp-size > 1 (its replies go to the DP controller)."""
    configure_logging(server_args.log_level,
                      prefix="scheduler" if dp_rank is None else f"scheduler{dp_rank}")
    ctx = zmq.Context(1)
    ctx.setsockopt(zmq.LINGER, 0)  # never wait on a dead peer at exit
    recv = ctx.socket(zmq.PULL)
    recv.bind(ports.scheduler_input)
    to_detok = ctx.socket(zmq.PUSH)
    to_detok.connect(ports.detokenizer_input)
    tokenizer_sock = ctx.socket(zmq.PUSH)
    tokenizer_sock.connect(ports.tokenizer_input)
    to_tokenizer: _Sender = (tokenizer_sock if dp_rank is None
                             else _ReplicaSender(tokenizer_sock, dp_rank))
    try:
        if tp is not None or server_args.kv_cache_dir is not None:
            # NOTE: SIGTERM (the launcher stopping us) ends the loop, which tells the other
            # ranks to stop: a rank on another node then exits 0, not "lost rank 0"; and
            # the disk tier finishes its queued writes.
            signal.signal(signal.SIGTERM, lambda *_: _STOP.set())
        if server_args.kv_cache_dir is not None and server_args.dp_size > 1 and dp_rank is not None:
            server_args = _replica_disk_tier(server_args, dp_rank)
        scheduler = _build_scheduler(server_args, model_dir, tp)
        to_tokenizer.send_pyobj(SchedulerReady(control.runner_info(scheduler)))
        if scheduler.grammars is not None:
            scheduler.grammars.start()
        _loop(scheduler, recv, to_detok, to_tokenizer)
        scheduler.close()
        scheduler.runner.stop_workers()
        os._exit(0)  # the parent died: exit now, without joining any worker thread
    except Exception as e:  # noqa: BLE001 - report every failure, then die
        logger.error("Scheduler failed:\n%s", traceback.format_exc())
        to_tokenizer.send_pyobj(ProcessError("scheduler", f"{type(e).__name__}: {e}"))
        tokenizer_sock.close(linger=1000)
        sys.exit(1)


def _replica_disk_tier(server_args: ServerArgs, dp_rank: int) -> ServerArgs:
    """A data-parallel replica's own disk tier: a subfolder and its share of the bytes."""
    import dataclasses

    assert server_args.kv_cache_dir is not None
    return dataclasses.replace(
        server_args, kv_cache_dir=os.path.join(server_args.kv_cache_dir, f"dp{dp_rank}"),
        kv_cache_disk_bytes=max(server_args.kv_cache_disk_bytes // server_args.dp_size, 1))


def _build_scheduler(server_args: ServerArgs, model_dir: str,
                     tp: TPConfig | None = None) -> Scheduler:
    import torch

    from radixlm.model_executor.model_runner import ModelRunner
    from radixlm.scheduler.grammar_manager import GrammarManager
    from radixlm.scheduler.scheduler import Scheduler
    from radixlm.tokenizer_utils import load_decode_tokenizer

    torch.manual_seed(server_args.random_seed)  # the RNG of requests that give no seed
    tokenizer_path = server_args.tokenizer_path or model_dir
    # --skip-tokenizer-init: no stop strings, grammars or jump-forward (validation refuses
    # them), and EOS comes from the model's config alone.
    skip = server_args.skip_tokenizer_init
    tokenizer = None if skip else load_decode_tokenizer(tokenizer_path)
    runner = ModelRunner(server_args, model_dir, tp)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        runner.eos_token_ids.add(int(tokenizer.eos_token_id))
    grammars = None
    if server_args.grammar_backend != "none" and not skip:
        grammars = GrammarManager(server_args, tokenizer_path, runner.vocab_size,
                                  runner.eos_token_ids)
    return Scheduler(server_args, runner, tokenizer, grammars)


def _loop(scheduler: Scheduler, recv: zmq.Socket[bytes], to_detok: zmq.Socket[bytes],
          to_tokenizer: _Sender) -> None:
    poller = zmq.Poller()
    poller.register(recv, zmq.POLLIN)
    parent = os.getppid()
    check_every = int(os.environ.get("RADIXLM_CHECK_INTEGRITY", "0"))
    # With TP ranks to keep alive, an idle loop wakes often enough to send heartbeats.
    idle_timeout = 1000 if scheduler.runner.step_broadcaster is None else 100
    while True:
        # Grammars still compiling: poll every few ms instead of spinning.
        timeout = 0 if scheduler.can_step_now else 5 if scheduler.has_work else idle_timeout
        while poller.poll(timeout):
            _handle(scheduler, recv.recv_pyobj(), to_tokenizer, to_detok)
            timeout = 0
        if not parent_alive(parent) or _STOP.is_set():
            logger.info("Parent process exited or stopped us; scheduler stops")
            return
        scheduler.runner.keep_alive()
        scheduler.runner.tune_threads()
        if isinstance(to_tokenizer, _ReplicaSender):
            to_tokenizer.report_load(scheduler)
        if scheduler.has_work:
            outs = scheduler.step()
            if outs:
                to_detok.send_pyobj(BatchTokenIDOut(outs))
            if scheduler.output.embedding_outs:
                to_tokenizer.send_pyobj(BatchEmbeddingOut(scheduler.output.embedding_outs))
                scheduler.output.embedding_outs = []
            if isinstance(to_tokenizer, _ReplicaSender):
                to_tokenizer.report_load(scheduler)
            if check_every and (scheduler.num_steps % check_every == 0
                                or not scheduler.has_work):
                scheduler.check_integrity()


def _handle(scheduler: Scheduler, msg: Any, to_tokenizer: _Sender,
            to_detok: zmq.Socket[bytes]) -> None:
    if isinstance(msg, TokenizedGenerateReq):
        if isinstance(to_tokenizer, _ReplicaSender):
            to_tokenizer.num_received += 1
        _add_request(scheduler, msg, to_tokenizer, to_detok)
    elif isinstance(msg, AbortReq):
        scheduler.abort(msg)
    elif isinstance(msg, FlushCacheReq):
        to_tokenizer.send_pyobj(control.flush_cache(scheduler))
    elif isinstance(msg, UpdateWeightsFromDiskReq):
        to_tokenizer.send_pyobj(control.update_weights_from_disk(scheduler, msg))
    elif isinstance(msg, ProfileReq):
        to_tokenizer.send_pyobj(scheduler.profiler.handle(msg))
    elif isinstance(msg, GetServerInfoReq):
        info = control.server_info(scheduler)
        try:
            scheduler.check_integrity()
            info.info["kv_integrity"] = "ok"
        except AssertionError as e:
            logger.error("KV integrity check failed: %s", e)
            info.info["kv_integrity"] = str(e)
        to_tokenizer.send_pyobj(info)
    else:
        logger.warning("Scheduler got an unknown message: %r", type(msg))


def _add_request(scheduler: Scheduler, msg: TokenizedGenerateReq,
                 to_tokenizer: _Sender, to_detok: zmq.Socket[bytes]) -> None:
    """Add a request; one the scheduler cannot take (a bug in validation) fails alone.

    NOTE: add_request changes no scheduler state before it has built the Req, so a
    failure here leaves nothing behind; the request ends with a 500 and the loop goes on.
    """
    try:
        scheduler.add_request(msg)
    except Exception:  # noqa: BLE001 - one bad request must not take the server down
        logger.exception("Could not add request %s; it fails", msg.rid)
        reason = FinishReason("abort", message="The server could not start this request",
                              status_code=500)
        if msg.pooling is not None:  # a pooling answer goes straight to the TokenizerManager
            to_tokenizer.send_pyobj(BatchEmbeddingOut([EmbeddingOut(
                rid=msg.rid, embedding=None, finished_reason=reason,
                prompt_tokens=len(msg.input_ids), cached_tokens=0)]))
            return
        to_detok.send_pyobj(BatchTokenIDOut([TokenOut(
            rid=msg.rid, new_token_ids=[], finished_reason=reason,
            prompt_tokens=len(msg.input_ids), completion_tokens=0, cached_tokens=0)]))
