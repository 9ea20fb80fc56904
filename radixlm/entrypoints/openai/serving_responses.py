"""/v1/responses: OpenAI's Responses API over the chat pipeline.

    POST   /v1/responses        create (store: true by default; previous_response_id)
    GET    /v1/responses/{id}   a stored response
    DELETE /v1/responses/{id}   forget it

The request becomes a chat request (responses_input.py) and goes through the
same prompt, tools, grammar and parsers as /v1/chat/completions; with
`previous_response_id` it continues that stored response's conversation
(response_store.py). The output is a list of items in order: `reasoning` (with
a reasoning parser), `message` (output_text) and `function_call`s. A stream
sends the Responses events: response.created, response.in_progress, then per
item output_item.added, its deltas (reasoning_text.delta, content_part.added +
output_text.delta, function_call_arguments.delta), their .done events and
output_item.done, and finally response.completed (or response.incomplete past
max_output_tokens) carrying the whole response with usage (SGLang's fields:
cached and cache-write input tokens, reasoning output tokens). Errors on these
routes have the Responses shape, `{"error": {message, type, param, code}}`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from radixlm.entrypoints.http.errors import APIError, JSONResponse
from radixlm.entrypoints.http.state import ServerState
from radixlm.entrypoints.http.utils import parse_body, sse_stream
from radixlm.entrypoints.openai.call_watch import STOP_MESSAGE
from radixlm.entrypoints.openai.response_store import output_messages
from radixlm.entrypoints.openai.responses_input import ResponsesRequest, to_chat_request
from radixlm.entrypoints.openai.serving_chat import ChatJob, is_cut, prepare_chat, run_chat
from radixlm.entrypoints.openai.tools import ChoiceOutput
from radixlm.messages.generate_output import GenerateOutput


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


async def create_response(request: Request, state: ServerState) -> Response:
    tm = state.engine()
    req = await parse_body(request, ResponsesRequest)
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        history = _stored(state, req.previous_response_id, "previous_response_id").messages
    chat = to_chat_request(req, history)
    job = await prepare_chat(state, chat)
    conversation = [m.model_dump(exclude_none=True) for m in chat.messages
                    if not (req.instructions and m is chat.messages[0])]
    builder = _ResponseBuilder(req, job, state, conversation)
    if not req.stream:
        out = (await run_chat(request, tm, job))[0]
        finish = out.finish_reason.type if out.finish_reason is not None else None
        parser = job.parser()
        parsed = parser.parse_whole(out.text, cut=is_cut(finish))
        builder.stopped = parser.stopped
        return JSONResponse(builder.finished(builder.response(parsed, out, "completed")))
    return await sse_stream(request, tm.generate(job.obj), builder.events, builder.tail)


def _stored(state: ServerState, response_id: str, param: str) -> Any:
    """The stored response `response_id` (SGLang's 400 / 404 texts otherwise)."""
    if not response_id.startswith("resp"):
        raise APIError(f"Invalid '{param}': '{response_id}'. Expected an ID that begins "
                       "with 'resp'.", param=param)
    stored = state.responses.get(response_id)
    if stored is None:
        raise APIError(f"Response with id '{response_id}' not found.", 404, param=param)
    return stored


async def retrieve_response(response_id: str, state: ServerState) -> Response:
    return JSONResponse(_stored(state, response_id, "response_id").response)


async def delete_response(response_id: str, state: ServerState) -> Response:
    _stored(state, response_id, "response_id")
    state.responses.delete(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


class _ResponseBuilder:
    def __init__(self, req: ResponsesRequest, job: ChatJob, state: ServerState,
                 conversation: list[dict[str, Any]]) -> None:
        self.req = req
        self.job = job
        self.state = state
        self.tm = state.tm
        self.conversation = conversation  # the turns before this response (no instructions)
        self.id = _id("resp")
        self.model = req.model or state.model_name
        self.created = int(time.time())
        self.parser = job.parser()
        self.stopped = False  # ended at a repeated call or the call limit
        self.seq = 0
        self.items: list[dict[str, Any]] = []  # output items so far (the open one last)
        self.open: str | None = None  # the open item's kind
        self.last: GenerateOutput | None = None
        self.reasoning_text = ""

    # -- the response object --------------------------------------------------------------

    def response(self, parsed: ChoiceOutput | None, out: GenerateOutput | None,
                 status: str) -> dict[str, Any]:
        items = self.items if parsed is None else _items(parsed)
        if parsed is not None:
            self.reasoning_text = parsed.reasoning
        incomplete = out is not None and out.finish_reason is not None \
            and out.finish_reason.type == "length" and not self.stopped
        if status == "completed" and incomplete:
            status = "incomplete"
        req = self.req
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "model": self.model, "output": items, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete"
            else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "temperature": req.temperature if req.temperature is not None else 1.0,
            "top_p": req.top_p if req.top_p is not None else 1.0,
            "tools": req.tools or [], "tool_choice": req.tool_choice or "auto",
            "parallel_tool_calls": req.parallel_tool_calls,
            "text": req.text or {"format": {"type": "text"}},
            "reasoning": req.reasoning, "previous_response_id": req.previous_response_id,
            "store": req.stores, "truncation": "disabled", "metadata": req.metadata or {},
            "user": req.user, "usage": self._usage(out) if out is not None else None,
        }

    def finished(self, response: dict[str, Any]) -> dict[str, Any]:
        """Store a final response (unless `store: false`); return it."""
        if self.req.stores:
            self.state.responses.put(response,
                                     self.conversation + output_messages(response["output"]))
        return response

    def _usage(self, out: GenerateOutput) -> dict[str, Any]:
        """SGLang's Responses usage; reasoning tokens are the think block's text
        tokenized again (the parsers split text, not token ids)."""
        reasoning = len(self.tm.tokenizer.encode(self.reasoning_text, add_special_tokens=False)
                        ) if self.reasoning_text else 0
        return {"input_tokens": out.prompt_tokens,
                "input_tokens_details": {"cached_tokens": out.cached_tokens,
                                         "cache_write_tokens": 0},
                "output_tokens": out.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": min(reasoning,
                                                                  out.completion_tokens)},
                "total_tokens": out.prompt_tokens + out.completion_tokens}

    # -- streaming ------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> bytes:
        body = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(body) + b"\n\n"

    def events(self, out: GenerateOutput) -> list[bytes]:
        events = []
        if self.last is None:
            events.append(self._event("response.created",
                                      response=self.response(None, None, "in_progress")))
            events.append(self._event("response.in_progress",
                                      response=self.response(None, None, "in_progress")))
        self.last = out
        if self.stopped:  # ended at a call: what follows is not shown
            return events
        finish = out.finish_reason.type if out.finish_reason is not None else None
        finished = finish is not None
        reasoning, content, calls = self.parser.feed(out.text, final=finished, cut=is_cut(finish))
        if self.parser.stopped:
            self.stopped = True
            if not finished:
                self.tm.abort_request(out.rid, message=STOP_MESSAGE)
            finished = True
        self.reasoning_text += reasoning
        if reasoning:
            events += self._open("reasoning")
            events.append(self._event("response.reasoning_text.delta", **self._where(),
                                      content_index=0, delta=reasoning))
            self.items[-1]["content"][0]["text"] += reasoning
        if content:
            events += self._open("message")
            events.append(self._event("response.output_text.delta", **self._where(),
                                      content_index=0, delta=content, logprobs=[]))
            self.items[-1]["content"][0]["text"] += content
        for call in calls:
            if call.get("id"):
                events += self._open("function_call", call)
            if call["function"]["arguments"]:
                events.append(self._event("response.function_call_arguments.delta",
                                          **self._where(), delta=call["function"]["arguments"]))
                self.items[-1]["arguments"] += call["function"]["arguments"]
        if finished:
            events += self._close()
        return events

    def tail(self) -> list[bytes]:
        events = self._close()
        response = self.finished(self.response(None, self.last, "completed"))
        kind = "response.incomplete" if response["status"] == "incomplete" else \
            "response.completed"
        return events + [self._event(kind, response=response)]

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.items[-1]["id"], "output_index": len(self.items) - 1}

    def _open(self, kind: str, call: dict[str, Any] | None = None) -> list[bytes]:
        if self.open == kind and kind != "function_call":
            return []
        events = self._close()
        item = _new_item(kind, call)
        self.items.append(item)
        self.open = kind
        events.append(self._event("response.output_item.added",
                                  output_index=len(self.items) - 1, item=dict(item,
                                                                              status="in_progress")))
        if kind == "message":
            events.append(self._event("response.content_part.added", **self._where(),
                                      content_index=0, part=dict(item["content"][0])))
        return events

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        item, where = self.items[-1], self._where()
        events = []
        if self.open == "reasoning":
            events.append(self._event("response.reasoning_text.done", **where, content_index=0,
                                      text=item["content"][0]["text"]))
        elif self.open == "message":
            part = item["content"][0]
            events.append(self._event("response.output_text.done", **where, content_index=0,
                                      text=part["text"], logprobs=[]))
            events.append(self._event("response.content_part.done", **where, content_index=0,
                                      part=part))
        else:
            events.append(self._event("response.function_call_arguments.done", **where,
                                      name=item["name"], arguments=item["arguments"]))
        events.append(self._event("response.output_item.done", output_index=where[
            "output_index"], item=item))
        self.open = None
        return events


def _new_item(kind: str, call: dict[str, Any] | None = None) -> dict[str, Any]:
    if kind == "reasoning":
        return {"type": "reasoning", "id": _id("rs"), "summary": [], "status": "completed",
                "content": [{"type": "reasoning_text", "text": ""}]}
    if kind == "message":
        return {"type": "message", "id": _id("msg"), "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": "", "annotations": [],
                             "logprobs": []}]}
    assert call is not None
    return {"type": "function_call", "id": _id("fc"), "call_id": call["id"],
            "name": call["function"]["name"], "arguments": "", "status": "completed"}


def _items(parsed: ChoiceOutput) -> list[dict[str, Any]]:
    items = []
    if parsed.reasoning:
        item = _new_item("reasoning")
        item["content"][0]["text"] = parsed.reasoning
        items.append(item)
    if parsed.content or not parsed.tool_calls:
        item = _new_item("message")
        item["content"][0]["text"] = parsed.content
        items.append(item)
    for call in parsed.tool_calls:
        item = _new_item("function_call", call)
        item["arguments"] = call["function"]["arguments"]
        items.append(item)
    return items
