"""Anthropic's streaming events for one /v1/messages request.

    event: message_start        the message with empty content and the prompt's usage
    event: ping
    per content block, in order (thinking, text, then one per tool call):
      event: content_block_start  {"index": i, "content_block": {"type": ..., ...}}
      event: content_block_delta  text_delta | thinking_delta | input_json_delta
      event: content_block_stop
    event: message_delta        {"delta": {"stop_reason", "stop_sequence"}, "usage"}
    event: message_stop

Each runtime output goes through the OpenAI layer's `ChoiceParser` (the
reasoning parser, then the tool parser); a kind of output other than the open
block's closes it and opens the next. A tool call, sent once complete, opens a
`tool_use` block (`id`, `name`, `input: {}`) whose `input_json_delta` holds its
arguments; an answer that repeats a call or reaches the call limit is ended
there (`stop_reason` "tool_use"), as on the OpenAI routes. An answer with no output at all still has one (empty)
text block, as the non-streamed message does. A failure after the first event
is an `error` event, and the stream ends there.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import StreamingResponse

from radixlm.entrypoints.anthropic.protocol import MessagesRequest
from radixlm.entrypoints.anthropic.response import stop_info, usage
from radixlm.entrypoints.http.error_shapes import anthropic_error_body
from radixlm.entrypoints.http.errors import APIError
from radixlm.entrypoints.http.utils import aclose, all_outputs, open_stream, sse_response
from radixlm.entrypoints.openai.call_watch import STOP_MESSAGE
from radixlm.entrypoints.openai.serving_chat import ChatJob, is_cut
from radixlm.messages.generate_output import GenerateOutput


def event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


async def stream_message(request: Request, tm: Any, req: MessagesRequest, job: ChatJob,
                         msg_id: str) -> StreamingResponse:
    """The event stream (errors before the first output are a plain HTTP error)."""
    outputs: AsyncIterator[GenerateOutput] = tm.generate(job.obj)
    first = await open_stream(request, outputs)
    translator = MessageStream(req, job, msg_id, tm)

    async def events() -> AsyncGenerator[bytes, None]:
        rest = all_outputs(first, outputs)
        try:
            async for out in rest:
                if isinstance(out, APIError):
                    yield event("error", anthropic_error_body(out.status_code, out.message))
                    break
                for e in translator.events(out):
                    yield e
        finally:
            await aclose(rest)

    return sse_response(events())


class MessageStream:
    """Runtime outputs of one request → Anthropic events (see the module docstring)."""

    def __init__(self, req: MessagesRequest, job: ChatJob, msg_id: str, tm: Any) -> None:
        self.req = req
        self.msg_id = msg_id
        self.tm = tm
        self.parser = job.parser()
        self.started = False
        self.ended = False  # message_stop was sent
        self.index = -1  # the latest block's index
        self.open_kind: str | None = None  # the open block's type
        self.call_blocks: dict[int, int] = {}  # tool call index → its block's index

    def events(self, out: GenerateOutput) -> list[bytes]:
        if self.ended:  # stopped at a call: what follows is not shown
            return []
        events = [] if self.started else self._start(out)
        finish = out.finish_reason.type if out.finish_reason is not None else None
        reasoning, content, calls = self.parser.feed(out.text, final=finish is not None,
                                                     cut=is_cut(finish))
        if self.parser.stopped and finish is None:  # a repeated call or the call limit
            self.tm.abort_request(out.rid, message=STOP_MESSAGE)
            finish = "stop"
        if reasoning:
            events += self._ensure("thinking", {"thinking": "", "signature": ""})
            if self.req.shows_thinking:
                events.append(self._delta({"type": "thinking_delta", "thinking": reasoning}))
        if content:
            events += self._ensure("text", {"text": ""})
            events.append(self._delta({"type": "text_delta", "text": content}))
        for call in calls:
            events += self._call(call)
        if finish is not None:
            self.ended = True
            events += self._finish(out)
        return events

    def _start(self, out: GenerateOutput) -> list[bytes]:
        self.started = True
        message: dict[str, Any] = {"id": self.msg_id, "type": "message", "role": "assistant",
                   "model": self.req.model, "content": [], "stop_reason": None,
                   "stop_sequence": None, "usage": {**usage(out), "output_tokens": 0}}
        return [event("message_start", {"type": "message_start", "message": message}),
                event("ping", {"type": "ping"})]

    def _ensure(self, kind: str, fields: dict[str, Any]) -> list[bytes]:
        """Open a block of `kind` unless one is open (closing another kind's first)."""
        if self.open_kind == kind:
            return []
        events = self._close()
        self.index += 1
        self.open_kind = kind
        events.append(event("content_block_start", {
            "type": "content_block_start", "index": self.index,
            "content_block": {"type": kind, **fields}}))
        return events

    def _close(self) -> list[bytes]:
        if self.open_kind is None:
            return []
        self.open_kind = None
        return [event("content_block_stop", {"type": "content_block_stop",
                                             "index": self.index})]

    def _delta(self, delta: dict[str, Any], index: int | None = None) -> bytes:
        return event("content_block_delta", {"type": "content_block_delta",
                                             "index": self.index if index is None else index,
                                             "delta": delta})

    def _call(self, call: dict[str, Any]) -> list[bytes]:
        events: list[bytes] = []
        function = call.get("function") or {}
        if call.get("id") is not None:  # a new call: its own block
            events += self._close()
            events += self._ensure("tool_use", {"id": call["id"], "name": function.get("name"),
                                                "input": {}})
            self.call_blocks[call["index"]] = self.index
        arguments = function.get("arguments")
        block = self.call_blocks.get(call.get("index", -1))
        if arguments and block == self.index and self.open_kind == "tool_use":
            events.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))
        return events

    def _finish(self, out: GenerateOutput) -> list[bytes]:
        events = self._close()
        if self.index < 0:  # nothing at all: one empty text block
            events += self._ensure("text", {"text": ""})
            events += self._close()
        stop = stop_info(out, self.parser, self.req.stop_sequences, bool(self.call_blocks))
        events.append(event("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": stop.reason, "stop_sequence": stop.sequence},
            "usage": usage(out)}))
        events.append(event("message_stop", {"type": "message_stop"}))
        return events
