"""HTTP plumbing shared by the native and the OpenAI routes.

- `parse_body` reads and validates a JSON body with a pydantic model, so every
  malformed or mistyped body becomes a 400 in the OpenAI error format
  (whatever its Content-Type: `curl -d` sends form-encoded headers).
- `collect` and `open_stream` drive `TokenizerManager.generate` for one
  request. Both map the runtime's failures to `APIError`s: a `ValueError`
  before the first output (validation) is a 400, `EngineDeadError` a 503, an
  abort with a status code that code. Both race the request against the
  client's disconnect: a client that goes away cancels the generate
  iterator, which aborts the request in the scheduler and frees its KV.
- `sse_stream` is the one skeleton of every streaming route: the first
  output (so that errors before it are plain HTTP errors), one or more
  events per output from the route's translator, an error event for a
  failure mid-stream, the route's tail (usage) after the last output, then
  `data: [DONE]`; a client that goes away aborts the request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import StreamingResponse

from radixlm.entrypoints.http.errors import APIError, ClientDisconnected, validation_error
from radixlm.messages.generate_output import GenerateOutput
from radixlm.tokenizer.tokenizer_manager import EngineDeadError

ModelT = TypeVar("ModelT", bound=BaseModel)
T = TypeVar("T")

SSE_DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


# Bodies past this size are parsed and validated in a worker thread: a 16 MiB body
# takes ~40 ms in orjson and a 2M-token list ~70 ms more in pydantic, each one C
# call that would hold the event loop (and /health) while it runs.
OFF_LOOP_BYTES = 1 << 20


def _loads(body: bytes) -> Any:
    if not body.strip():
        raise APIError("The request body is empty; expected a JSON object")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise APIError(f"Malformed JSON in the request body: {e}") from e


async def _off_loop_if_large(body: bytes, parse: Callable[[bytes], T]) -> T:
    if len(body) > OFF_LOOP_BYTES:
        return await asyncio.to_thread(parse, body)
    return parse(body)


async def read_json(request: Request) -> Any:
    return await _off_loop_if_large(await request.body(), _loads)


def _validate(data: Any, model: type[ModelT]) -> ModelT:
    if not isinstance(data, dict):
        raise APIError(f"The request body must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e) from e


async def parse_body(request: Request, model: type[ModelT]) -> ModelT:
    """The body validated as `model`; raise APIError(400) naming the problem."""
    return await _off_loop_if_large(await request.body(),
                                    lambda body: _validate(_loads(body), model))


# ---------------------------------------------------------------- driving generate


def check_output(out: GenerateOutput) -> None:
    """Raise APIError for an output whose abort carries an HTTP status (e.g. a bad grammar)."""
    status = out.status_code
    if status is not None and status != 200:
        message = out.finish_reason.message if out.finish_reason is not None else None
        raise APIError(message or "The request failed", status)


async def _wait_disconnect(request: Request) -> None:
    # NOTE: call only after the body is read; uvicorn then answers receive() only
    # with http.disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def race_disconnect(request: Request, coro: Awaitable[T]) -> T:
    """Await `coro`; if the client disconnects first, cancel it and raise ClientDisconnected."""
    work: asyncio.Future[T] = asyncio.ensure_future(coro)
    watch: asyncio.Future[Any] = asyncio.ensure_future(_wait_disconnect(request))
    try:
        pending: set[asyncio.Future[Any]] = {work, watch}
        await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            return work.result()
        raise ClientDisconnected()
    finally:
        for task in (work, watch):
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task


def _map_errors(e: BaseException) -> BaseException:
    if isinstance(e, ValueError):
        return APIError(str(e), 400)
    if isinstance(e, EngineDeadError):
        return APIError(f"The engine is not running: {e}", 503)
    return e


async def collect(request: Request, outputs: AsyncIterator[GenerateOutput]
                  ) -> list[GenerateOutput]:
    """Every final output of a non-streaming request, sorted by index."""

    async def run() -> list[GenerateOutput]:
        try:
            outs = [out async for out in outputs]
        except (ValueError, EngineDeadError) as e:
            raise _map_errors(e) from e
        for out in outs:
            check_output(out)
        return sorted(outs, key=lambda o: o.index)

    return await race_disconnect(request, run())


async def open_stream(request: Request, outputs: AsyncIterator[GenerateOutput]
                      ) -> GenerateOutput:
    """Wait for the first output of a stream, so that validation errors become a plain
    HTTP error before any event is sent; the caller goes on iterating `outputs`."""

    async def first() -> GenerateOutput:
        try:
            out = await outputs.__anext__()
        except StopAsyncIteration as e:
            raise APIError("The request produced no output", 500) from e
        except (ValueError, EngineDeadError) as e:
            raise _map_errors(e) from e
        check_output(out)
        return out

    try:
        return await race_disconnect(request, first())
    except BaseException:
        await aclose(outputs)
        raise


async def rest_of_stream(outputs: AsyncIterator[GenerateOutput]
                         ) -> AsyncIterator[GenerateOutput | APIError]:
    """The outputs after the first; a failure mid-stream is yielded as an APIError
    (the caller sends it as an error event) and ends the stream."""
    try:
        async for out in outputs:
            try:
                check_output(out)
            except APIError as e:
                yield e
                return
            yield out
    except (ValueError, EngineDeadError) as e:
        err = _map_errors(e)
        yield err if isinstance(err, APIError) else APIError(str(e), 500)
    finally:
        await aclose(outputs)


def sse_error(e: APIError) -> bytes:
    return sse({"error": {"object": "error", "message": e.message, "type": e.err_type,
                          "param": e.param, "code": e.code}})


def sse_response(events: AsyncGenerator[bytes, None]) -> StreamingResponse:
    """A server-sent-events response over `events`."""
    # NOTE: a client that disconnects mid-stream can leave `events` suspended at a
    # yield; closing it afterwards runs the TokenizerManager's cleanup at once, which
    # aborts the request and frees its KV.
    return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS,
                             background=BackgroundTask(events.aclose))


async def all_outputs(first: GenerateOutput, outputs: AsyncIterator[GenerateOutput]
                      ) -> AsyncIterator[GenerateOutput | APIError]:
    """`first` (from open_stream), then the rest of the stream (see rest_of_stream)."""
    rest = rest_of_stream(outputs)
    try:
        yield first
        async for out in rest:
            yield out
    finally:
        await aclose(rest)


async def sse_stream(
    request: Request,
    outputs: AsyncIterator[GenerateOutput],
    on_output: Callable[[GenerateOutput], Iterable[bytes]],
    on_end: Callable[[], Iterable[bytes]] | None = None,
) -> StreamingResponse:
    """Stream `outputs` as server-sent events: `on_output` gives each output's events,
    `on_end` those after the last output (not after an error), then `data: [DONE]`."""
    first = await open_stream(request, outputs)

    async def events() -> AsyncGenerator[bytes, None]:
        rest = all_outputs(first, outputs)
        try:
            async for out in rest:
                if isinstance(out, APIError):
                    yield sse_error(out)
                    break
                for event in on_output(out):
                    yield event
            else:
                for event in on_end() if on_end is not None else ():
                    yield event
            yield SSE_DONE
        finally:
            await aclose(rest)

    return sse_response(events())


async def aclose(it: AsyncIterator[Any]) -> None:
    """Close an async generator now (running its cleanup) rather than when collected."""
    close = getattr(it, "aclose", None)
    if close is not None:
        await close()
