"""The offline Engine: the serving processes without HTTP.

    with Engine(max_total_tokens=4096) as engine:
        out = engine.generate("The capital of France is", {"max_new_tokens": 16})
        for chunk in engine.generate("Hi", {"max_new_tokens": 8}, stream=True):
            print(chunk["delta"], end="")

Results are SGLang's dicts (`text`, `output_ids`, `meta_info`, `index`). A
stream's chunks add `delta`, the new text; they are cumulative (the text, ids
and logprobs so far) unless `incremental_streaming_output=True`, which makes
each chunk carry only what is new, at a cost per token that does not grow
with the stream.

The TokenizerManager runs on a private event loop in a background thread, so
the sync API works anywhere and the async API works from any event loop.
`shutdown()` (or leaving the `with` block) stops every child process; if a
child dies, calls raise `EngineDeadError` instead of hanging.
"""

from __future__ import annotations

import asyncio
import atexit
import queue
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

from radixlm.entrypoints.child_process import ChildProcess
from radixlm.entrypoints.family_defaults import with_family_defaults
from radixlm.entrypoints.launch import launch_children, make_is_alive, stop_children
from radixlm.messages.generate_output import SampleDicts, final_dict, token_only
from radixlm.server_args import ServerArgs
from radixlm.tokenizer.pooling_input import EmbeddingReqInput
from radixlm.tokenizer.request_input import GenerateReqInput
from radixlm.tokenizer.tokenizer_manager import EngineDeadError, TokenizerManager
from radixlm.utils import PortArgs

_DONE = object()
T = TypeVar("T")


class Engine:
    def __init__(self, server_args: ServerArgs | None = None, **kwargs: Any) -> None:
        self.server_args = with_family_defaults(server_args or ServerArgs(**kwargs))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="radixlm-engine-loop")
        self._thread.start()
        self._procs: list[ChildProcess] = []
        self._ports: PortArgs | None = None
        self._closed = False
        try:
            model_dir, self._ports, self._procs = launch_children(self.server_args)
            self.tokenizer_manager: TokenizerManager = self._run(self._start(model_dir))
        except BaseException:
            self.shutdown()
            raise
        atexit.register(self.shutdown)

    async def _start(self, model_dir: str) -> TokenizerManager:
        assert self._ports is not None
        tm = TokenizerManager(self.server_args, model_dir, self._ports)
        try:
            tm.start(make_is_alive(self._procs))
            await tm.wait_ready(timeout=600)
        except BaseException:
            # NOTE: a failed start closes its sockets here (linger 0) and terminates its
            # context: left to the garbage collector, the context's term() would block
            # the next Engine's thread for good on these still-open sockets.
            tm.close()
            raise
        return tm

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    # ------------------------------------------------------------------ API

    @property
    def tokenizer(self) -> Any:
        return self.tokenizer_manager.tokenizer

    @property
    def model_info(self) -> dict[str, Any]:
        return self.tokenizer_manager.model_info

    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool | list[bool] = False,
        logprob_start_len: int | list[int] | None = None,
        top_logprobs_num: int | list[int] | None = None,
        stream: bool = False,
        rid: str | list[str] | None = None,
        image_data: Any = None,
        video_data: Any = None,
        return_hidden_states: bool | list[bool] = False,
        priority: int | list[int] | None = None,
    ) -> Any:
        """Generate for one prompt (returns a dict) or a batch (a list, one per sample).

        With stream=True, returns an iterator of chunks (`index`, `delta`, `text`, ...).
        `image_data` / `video_data`: see request_input.py (PIL images are accepted too).
        """
        obj = GenerateReqInput(
            text=prompt, input_ids=input_ids, sampling_params=sampling_params, rid=rid,
            return_logprob=return_logprob, logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num, stream=stream, image_data=image_data,
            video_data=video_data, return_hidden_states=return_hidden_states,
            priority=priority,
        )
        obj.default_prompt_logprobs()
        if stream:
            return self._iterate(obj)
        return self._run(self._collect(obj))

    async def async_generate(self, prompt: Any = None, sampling_params: Any = None,
                             stream: bool = False, **kwargs: Any) -> Any:
        """Async twin of `generate`, usable from any event loop."""
        obj = GenerateReqInput(text=prompt, sampling_params=sampling_params, stream=stream,
                               **kwargs)
        obj.default_prompt_logprobs()
        if stream:
            return self._aiterate(obj)
        future = asyncio.run_coroutine_threadsafe(self._collect(obj), self._loop)
        return await asyncio.wrap_future(future)

    async def _collect(self, obj: GenerateReqInput) -> Any:
        no_text = self.tokenizer_manager.tokenizer is None  # --skip-tokenizer-init
        outs = [token_only(final_dict(out), no_text)
                async for out in self.tokenizer_manager.generate(obj)]
        outs.sort(key=lambda o: o["index"])
        return outs if obj.is_batch or len(outs) > 1 else outs[0]

    async def _chunks(self, obj: GenerateReqInput) -> AsyncIterator[dict[str, Any]]:
        """A stream's outputs as chunk dicts (per sample: cumulative or incremental)."""
        incremental = self.server_args.incremental_streaming_output
        samples: dict[int, SampleDicts] = {}
        async for out in self.tokenizer_manager.generate(obj):
            sample = samples.get(out.index)
            if sample is None:
                sample = samples[out.index] = SampleDicts(incremental)
            yield token_only(sample.add(out), self.tokenizer_manager.tokenizer is None)

    def _iterate(self, obj: GenerateReqInput) -> Iterator[dict[str, Any]]:
        q: queue.Queue[Any] = queue.Queue()

        async def pump() -> None:
            try:
                async for out in self._chunks(obj):
                    q.put(out)
                q.put(_DONE)
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                q.put(e)

        future = asyncio.run_coroutine_threadsafe(pump(), self._loop)
        try:
            while True:
                item = q.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            future.cancel()  # a consumer that stops early aborts the request

    async def _aiterate(self, obj: GenerateReqInput) -> AsyncIterator[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[Any] = asyncio.Queue()

        async def pump() -> None:
            try:
                async for out in self._chunks(obj):
                    loop.call_soon_threadsafe(q.put_nowait, out)
                loop.call_soon_threadsafe(q.put_nowait, _DONE)
            except BaseException as e:  # noqa: BLE001
                loop.call_soon_threadsafe(q.put_nowait, e)

        future = asyncio.run_coroutine_threadsafe(pump(), self._loop)
        try:
            while True:
                item = await q.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            future.cancel()

    def encode(self, prompt: str | list[str] | None = None,
               input_ids: list[int] | list[list[int]] | None = None,
               dimensions: int | None = None) -> Any:
        """A pooling model's vectors (or a classifier's label logits), as /encode answers:
        `{"embedding", "meta_info"}` for one input, a list for a batch."""
        obj = EmbeddingReqInput(text=prompt, input_ids=input_ids, dimensions=dimensions)
        results = self._run(self.tokenizer_manager.encode(obj))
        outs = [{"embedding": r.embedding, "meta_info": {
            "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens}} for r in results]
        return outs if obj.is_batch else outs[0]

    def abort(self, rid: str | None = None, abort_all: bool = False) -> None:
        self._loop.call_soon_threadsafe(self.tokenizer_manager.abort_request, rid, abort_all)

    def get_server_info(self) -> dict[str, Any]:
        return self._run(self.tokenizer_manager.get_server_info())

    def flush_cache(self) -> bool:
        return self._run(self.tokenizer_manager.flush_cache()).success

    # ------------------------------------------------------------------ lifetime

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        tm = getattr(self, "tokenizer_manager", None)
        if tm is not None and self._loop.is_running():
            # Close first, so the watchdog does not report the children we stop.
            try:
                asyncio.run_coroutine_threadsafe(_close(tm), self._loop).result(5)
            except Exception:  # noqa: BLE001 - best effort at exit
                pass
        stop_children(self._procs, self._ports)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


async def _close(tm: TokenizerManager) -> None:
    tm.close()


__all__ = ["Engine", "EngineDeadError"]
