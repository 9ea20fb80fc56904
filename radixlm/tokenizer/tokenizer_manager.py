"""The TokenizerManager: the asyncio front of the engine.

It validates and tokenizes requests, expands `n` into samples, sends them to
the scheduler, and turns the detokenizer's text deltas into outputs.
Tokenizing runs in `tokenizer_workers` (async_tokenizer.py) and images and
videos are loaded and preprocessed by its `mm_processor`, both in worker
threads, so the event loop never blocks on them (a text-only model's
processor refuses media). A request is validated whole before any of it is
sent, and whatever it registered is released however it ends. A caller that
stops listening (a client that disconnects, a cancelled task) aborts its
request, which frees its KV. If a child process dies, every pending and
future request fails with `EngineDeadError` instead of hanging. Its parts
live beside it: request_prep.py readies a request, sample_state.py keeps each
sample in flight and makes its outputs, control_channel.py carries control
requests.

Pooling models (embeddings, classifiers) answer `encode()` instead of
`generate()`: each input is a prefill-only request whose vector comes back
from the scheduler as an `EmbeddingOut`.

A weight update waits until no generate or encode call is in flight, and new
calls wait until it is done (SGLang's reader/writer discipline, weights_lock.py),
so every request runs on one set of weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextvars import ContextVar
from typing import Any

import zmq
import zmq.asyncio

from radixlm.messages.generate_output import GenerateOutput
from radixlm.messages.io_struct import (
    AbortReq,
    BatchEmbeddingOut,
    BatchStrOut,
    FlushCacheOut,
    FlushCacheReq,
    GetServerInfoReq,
    PoolingParams,
    ProcessError,
    ProfileOut,
    ProfileReq,
    SchedulerReady,
    ServerInfoOut,
    StrOut,
    TokenizedGenerateReq,
    UpdateWeightsFromDiskOut,
    UpdateWeightsFromDiskReq,
    sample_rid,
)
from radixlm.messages.mm_inputs import MultimodalInputs
from radixlm.messages.sampling_params import SamplingParams, sample_seed
from radixlm.multimodal.processor import TextOnlyProcessor, create_mm_processor
from radixlm.server_args import ServerArgs
from radixlm.tokenizer.async_tokenizer import AsyncTokenizer
from radixlm.tokenizer.control_channel import ControlChannel, ReplyT
from radixlm.tokenizer.pooling_input import EmbeddingReqInput, check_dimensions, tokenize_pooling
from radixlm.tokenizer.pooling_output import EmbeddingResult, embedding_result
from radixlm.tokenizer.request_input import GenerateReqInput, SingleReq
from radixlm.tokenizer.request_prep import RequestPreparer
from radixlm.tokenizer.sample_state import SampleState, merge_outputs, output_of
from radixlm.tokenizer.validation import check_rids
from radixlm.tokenizer.weights_lock import WeightsLock
from radixlm.utils import PortArgs

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """A child process of the engine died; no request can be served."""


_BACKGROUND: ContextVar[bool] = ContextVar("radixlm_background_traffic", default=False)


@contextlib.contextmanager
def background_traffic() -> Iterator[None]:
    """Requests sent inside this block run as Batch API traffic: the scheduler admits
    them after online requests and retracts them first."""
    token = _BACKGROUND.set(True)
    try:
        yield
    finally:
        _BACKGROUND.reset(token)


class TokenizerManager:
    def __init__(self, server_args: ServerArgs, model_dir: str, ports: PortArgs,
                 tokenizer: Any = None) -> None:
        """`tokenizer`: an already loaded tokenizer (loading one takes seconds, so a
        server loads it in a thread instead of blocking its event loop); None loads it."""
        from radixlm.tokenizer_utils import load_tokenizer

        self.args = server_args
        self.model_dir = model_dir
        # None with --skip-tokenizer-init: token ids in, token ids out.
        self.tokenizer: Any = None
        if not server_args.skip_tokenizer_init:
            self.tokenizer = tokenizer or load_tokenizer(server_args.tokenizer_path or model_dir)
        self.tokenizer_workers = AsyncTokenizer(self.tokenizer)
        self.mm_processor = (
            TextOnlyProcessor(server_args.model_name) if self.tokenizer is None
            else create_mm_processor(server_args, model_dir, self.tokenizer))
        self.preparer = RequestPreparer(server_args, self.tokenizer, self.tokenizer_workers,
                                        self.mm_processor)
        self.ctx = zmq.asyncio.Context(1)
        self.ctx.setsockopt(zmq.LINGER, 0)  # closing never waits on a dead child
        self.to_scheduler = self.ctx.socket(zmq.PUSH)
        self.to_scheduler.connect(ports.scheduler_input)
        self.recv = self.ctx.socket(zmq.PULL)
        self.recv.bind(ports.tokenizer_input)
        self.states: dict[str, SampleState] = {}
        self.model_info: dict[str, Any] = {}
        self.ready = asyncio.Event()
        self.dead_reason: str | None = None
        self.control = ControlChannel(self.to_scheduler)
        self.last_receive_time = time.monotonic()
        self.on_sample_finished: Callable[[GenerateOutput], None] | None = None
        # (seconds since the sample's previous tokens, number of new tokens): metrics
        self.on_tokens: Callable[[float, int], None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._is_alive: Callable[[], str | None] | None = None
        self.model_path: str = server_args.model_path or model_dir  # changes with weights
        # Weight updates: calls in flight hold the weights; an update waits for none.
        self.weights_lock = WeightsLock()

    def start(self, is_alive: Callable[[], str | None]) -> None:
        """Start the receive loop and the child watchdog (`is_alive` returns a death reason)."""
        self._is_alive = is_alive
        self._tasks.append(asyncio.create_task(self._receive_loop()))
        self._tasks.append(asyncio.create_task(self._watchdog(is_alive)))

    async def wait_ready(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self.ready.wait(), timeout)
        except TimeoutError as e:
            raise EngineDeadError(f"The scheduler was not ready after {timeout:.0f} s") from e
        if self.dead_reason:
            raise EngineDeadError(self.dead_reason)

    # ------------------------------------------------------------------ generate

    async def generate(self, obj: GenerateReqInput) -> AsyncIterator[GenerateOutput]:
        """Yield outputs: for streams, one per delta; otherwise one per sample at its end.

        Each output carries what its sample produced since its previous output
        (see messages/generate_output.py); `index` is its place in the prompt-major list of
        samples.
        """
        self._check_alive()
        if not self.model_info.get("is_generation", True):
            raise ValueError("This model is served for embeddings or classification; it does "
                             "not generate text (use /v1/embeddings, /encode or /classify)")
        # NOTE: normalizing and validating walk every token id in Python: in a worker, so
        # a request of millions of ids leaves the event loop free (the GIL switches).
        singles = await self.tokenizer_workers.run(obj.normalize)
        # Validate all before sending any.
        prepared = [await self.preparer.prepare(s, self.model_info) for s in singles]
        check_rids(singles, [params.n for _, params, _ in prepared], self.states)
        states: list[SampleState] = []
        async with self.weights_lock.holding():
            try:
                for single, (input_ids, params, mm_inputs) in zip(singles, prepared):
                    self._send(single, input_ids, params, mm_inputs, states)
                async for out in merge_outputs(states):
                    yield out
            finally:
                self._forget(states)

    def _forget(self, states: list[SampleState]) -> None:
        """Abort what is unfinished and drop every state (however the call ended)."""
        for s in states:
            if not s.finished:
                self.abort_request(s.rid, message="The client disconnected or stopped "
                                   "reading the response")
        for s in states:
            self.states.pop(s.rid, None)

    # ------------------------------------------------------------------ encode

    async def encode(self, obj: EmbeddingReqInput) -> list[EmbeddingResult]:
        """One result per input, in order. Raises ValueError for a bad request (or a
        generation model), RequestAborted when a request is aborted."""
        self._check_alive()
        if self.model_info.get("is_generation", True):
            raise ValueError("This model generates text; embeddings and scores need a pooling "
                             "model (serve it with --is-embedding, or an embedding or "
                             "*ForSequenceClassification checkpoint)")
        singles = obj.normalize()
        check_dimensions(obj.dimensions, self.model_info)
        # NOTE: tokenizing runs in the tokenizer workers: a long input leaves the loop free.
        prepared = [await self.tokenizer_workers.run(tokenize_pooling, self.tokenizer,
                                                     self.model_info, s, i)
                    for i, s in enumerate(singles)]
        params = SamplingParams.from_dict({"max_new_tokens": 0})
        background = _BACKGROUND.get()
        states: list[SampleState] = []
        async with self.weights_lock.holding():
            try:
                for i, (single, (ids, types)) in enumerate(zip(singles, prepared)):
                    if single.rid in self.states:
                        raise ValueError(f"Duplicate request id {single.rid!r}")
                    state = SampleState(i, single.rid, False, False, False)
                    self.states[single.rid] = state
                    states.append(state)
                    self.to_scheduler.send_pyobj(TokenizedGenerateReq(
                        rid=single.rid, input_ids=ids, sampling_params=params,
                        pooling=PoolingParams(obj.dimensions, types), background=background))
                return [await embedding_result(s) for s in states]
            finally:
                self._forget(states)

    def _priority(self, priority: int | None) -> int:
        """The scheduler's priority of a request: as given (or the server's default) with
        priority scheduling, else 0 (SGLang ignores the field then)."""
        if not self.args.priority_scheduling:
            return 0
        if priority is None:
            return self.args.default_priority_value or 0
        return priority

    def _send(self, single: SingleReq, input_ids: list[int], params: SamplingParams,
              mm_inputs: MultimodalInputs | None, states: list[SampleState]) -> None:
        """Register and send the request's samples, appending each to `states` first (so
        the caller releases whatever was registered, even if sending fails)."""
        n = params.n
        group = f"{single.rid}-{uuid.uuid4().hex[:8]}" if n > 1 else None
        logprob_start_len = (single.logprob_start_len
                             if single.return_logprob and single.logprob_start_len >= 0 else None)
        for i in range(n):
            rid = sample_rid(single.rid, i, n)
            state = SampleState(len(states), rid, single.stream, single.return_logprob,
                                single.return_text_in_logprobs)
            if logprob_start_len is not None:
                state.prompt_ids, state.logprob_start_len = input_ids, logprob_start_len
            self.states[rid] = state
            states.append(state)
            seed = sample_seed(params.seed, i)
            self.to_scheduler.send_pyobj(TokenizedGenerateReq(
                rid=rid, input_ids=input_ids, sampling_params=params,
                return_logprob=single.return_logprob, logprob_start_len=logprob_start_len,
                top_logprobs_num=single.top_logprobs_num, stream=single.stream,
                group_id=group, seed=seed, mm_inputs=mm_inputs, background=_BACKGROUND.get(),
                return_hidden_states=single.return_hidden_states,
                priority=self._priority(single.priority),
            ))

    def abort_request(self, rid: str | None = None, abort_all: bool = False,
                      message: str = "Aborted by request") -> None:
        """Abort a request (its samples) or all; `message`: the reason the scheduler logs."""
        if self.dead_reason:
            return
        self.to_scheduler.send_pyobj(AbortReq(rid=rid, abort_all=abort_all, message=message))

    # ------------------------------------------------------------------ control

    async def get_server_info(self) -> dict[str, Any]:
        reply = await self._control(GetServerInfoReq(), ServerInfoOut)
        return reply.info

    async def flush_cache(self) -> FlushCacheOut:
        return await self._control(FlushCacheReq(), FlushCacheOut)

    async def update_weights_from_disk(self, model_path: str, load_format: str | None = None,
                                       abort_all_requests: bool = False
                                       ) -> UpdateWeightsFromDiskOut:
        """Swap weights once no call is in flight (new ones wait meanwhile); with
        `abort_all_requests`, the running requests are aborted instead of awaited."""
        async with self.weights_lock.updating():
            if abort_all_requests:
                self.abort_request(abort_all=True, message="Aborted for a weight update")
            await self.weights_lock.wait_free()
            reply: UpdateWeightsFromDiskOut = await self._control(
                UpdateWeightsFromDiskReq(model_path, load_format), UpdateWeightsFromDiskOut,
                timeout=3600.0)
            if reply.success:
                self.model_path = model_path
            return reply

    async def profile(self, req: ProfileReq) -> ProfileOut:
        reply: ProfileOut = await self._control(req, ProfileOut)
        return reply

    async def _control(self, msg: object, reply_type: type[ReplyT],
                       timeout: float = 60.0) -> ReplyT:
        """Send a control message and wait for the scheduler's reply of `reply_type`."""
        self._check_alive()
        return await self.control.call(msg, reply_type, timeout)

    # ------------------------------------------------------------------ receive

    async def _receive_loop(self) -> None:
        while True:
            msg = await self.recv.recv_pyobj()
            self.last_receive_time = time.monotonic()
            if isinstance(msg, BatchStrOut):
                for out in msg.outs:
                    self._on_str_out(out)
            elif isinstance(msg, BatchEmbeddingOut):
                for emb in msg.outs:
                    state = self.states.get(emb.rid)
                    if state is not None and not state.finished:
                        state.finished = True
                        state.queue.put_nowait(emb)
            elif isinstance(msg, SchedulerReady):
                self.model_info = msg.model_info
                self.ready.set()
            elif isinstance(msg, ProcessError):
                # NOTE: a child that died (a TP rank) makes the scheduler's collective fail
                # a moment later; the dead child is the cause worth naming.
                dead = self._is_alive() if self._is_alive is not None else None
                failed = f"The {msg.who} process failed: {msg.message}"
                self._die(f"{dead}; then: {failed}" if dead else failed)
            else:
                self.control.answer(msg)

    def _on_str_out(self, msg: StrOut) -> None:
        state = self.states.get(msg.rid)
        if state is None or state.finished:
            return
        tok = msg.token_out
        if tok.new_token_ids:
            now = time.monotonic()
            if state.first_token_time is None:
                state.first_token_time = now
            elif self.on_tokens is not None and state.last_token_time is not None:
                self.on_tokens(now - state.last_token_time, len(tok.new_token_ids))
            state.last_token_time = now
        out = output_of(state, msg, self.tokenizer)
        if out is None:
            return  # a non-streaming sample answers once, at its end
        if out.finished and self.on_sample_finished is not None:
            self.on_sample_finished(out)
        state.queue.put_nowait(out)

    # ------------------------------------------------------------------ health

    def stalled_seconds(self) -> float:
        """How long the scheduler has been silent while it holds a request: 0 when it
        holds none (finished requests and requests still being prepared don't count)."""
        pending = [s.created for s in self.states.values() if not s.finished]
        if not pending:
            return 0.0
        return time.monotonic() - max(self.last_receive_time, min(pending))

    async def _watchdog(self, is_alive: Callable[[], str | None]) -> None:
        while self.dead_reason is None:
            await asyncio.sleep(0.5)
            reason = is_alive()
            if reason:
                self._die(reason)

    def _die(self, reason: str) -> None:
        if self.dead_reason is not None:
            return
        logger.error("Engine is dead: %s", reason)
        self.dead_reason = reason
        self.ready.set()
        error = EngineDeadError(reason)
        for state in self.states.values():
            state.queue.put_nowait(error)
        self.control.fail_all(error)

    def _check_alive(self) -> None:
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)

    def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        self.mm_processor.close()
        self.tokenizer_workers.close()
        self.to_scheduler.close(linger=0)
        self.recv.close(linger=0)
        self.ctx.term()
