"""Runtime outputs of one /api/chat or /api/generate request → Ollama's JSON objects.

    chat:      {"model", "created_at", "message": {"role": "assistant", "content",
                "thinking"?, "tool_calls"?}, "done", ...}
    generate:  {"model", "created_at", "response", "thinking"?, "done", ..., "context"?}

A stream sends one object per output with the new text (`done: false`), then
a last one with `done: true`, `done_reason` ("stop" | "length"), the counts
(`prompt_eval_count`, `eval_count`) and the durations in nanoseconds
(`total_duration` from the request's arrival, `prompt_eval_duration` to the
first output token, `eval_duration` after it; `load_duration` is 0: the model
is always loaded). A whole answer is that last object with everything in it.

Tool calls (chat): each with its arguments as an object (Ollama's shape), sent
whole once complete; a call cut by the token limit is dropped, and an answer
that repeats a call or reaches the call limit ends there (done_reason "stop"),
as on the OpenAI routes.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from radixlm.entrypoints.openai.call_watch import STOP_MESSAGE
from radixlm.entrypoints.openai.serving_chat import ChatJob, is_cut
from radixlm.entrypoints.openai.tools import ChoiceParser
from radixlm.messages.generate_output import GenerateOutput


def created_at() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def load_reply(model: str, chat: bool, keep_alive: Any) -> dict[str, Any]:
    """The answer to an empty request (Ollama's way to load or unload a model)."""
    unload = keep_alive == 0 or keep_alive == "0"
    body: dict[str, Any] = {"model": model, "created_at": created_at(), "done": True,
                            "done_reason": "unload" if unload else "load"}
    if chat:
        body["message"] = {"role": "assistant", "content": ""}
    else:
        body["response"] = ""
    return body


def ollama_call(call_id: str, index: int, name: str, arguments: str) -> dict[str, Any] | None:
    """An OpenAI call as Ollama's tool call, or None when its arguments are not a whole
    JSON object (cut)."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict):
        return None
    return {"id": call_id, "function": {"index": index, "name": name, "arguments": value}}


class Reply:
    """One request's outputs as Ollama objects (`chat`: /api/chat, else /api/generate)."""

    def __init__(self, model: str, job: ChatJob, chat: bool, start_ns: int, tm: Any,
                 context_ids: list[int] | None = None) -> None:
        self.model = model
        self.tm = tm
        self.ended = False  # the last object was sent
        self.job = job
        self.chat = chat
        self.start_ns = start_ns
        self.context_ids = context_ids  # /api/generate: the prompt's ids, for `context`
        self.output_ids: list[int] = []
        self.parser: ChoiceParser = job.parser()

    # ---------------------------------------------------------------- whole

    def whole(self, out: GenerateOutput) -> dict[str, Any]:
        self.output_ids += out.token_ids
        finish = out.finish_reason.type if out.finish_reason is not None else None
        parsed = self.parser.parse_whole(out.text, cut=is_cut(finish))
        calls = [c for i, raw in enumerate(parsed.tool_calls)
                 if (c := ollama_call(raw["id"], i, raw["function"]["name"],
                                      raw["function"]["arguments"])) is not None]
        finish = "stop" if self.parser.stopped else finish
        return {**self._body(parsed.reasoning, parsed.content, calls),
                **self._final(out, finish)}

    # ---------------------------------------------------------------- streamed

    def chunks(self, out: GenerateOutput) -> list[dict[str, Any]]:
        if self.ended:  # stopped at a call: what follows is not shown
            return []
        self.output_ids += out.token_ids
        finish = out.finish_reason.type if out.finish_reason is not None else None
        reasoning, content, deltas = self.parser.feed(out.text, final=finish is not None,
                                                      cut=is_cut(finish))
        if self.parser.stopped and finish is None:  # a repeated call or the call limit
            self.tm.abort_request(out.rid, message=STOP_MESSAGE)
            finish = "stop"
        final = finish is not None
        calls = [c for d in deltas
                 if (c := ollama_call(d["id"], d["index"], d["function"]["name"],
                                      d["function"]["arguments"])) is not None]
        chunks = []
        if reasoning or content or calls:
            chunks.append({**self._body(reasoning, content, calls), "done": False})
        if final:
            self.ended = True
            chunks.append({**self._body("", "", []), **self._final(out, finish)})
        return chunks

    # ---------------------------------------------------------------- fields

    def _body(self, reasoning: str, content: str, calls: list[dict[str, Any]]
              ) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "created_at": created_at()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if reasoning:
                message["thinking"] = reasoning
            if calls:
                message["tool_calls"] = calls
            body["message"] = message
        else:
            body["response"] = content
            if reasoning:
                body["thinking"] = reasoning
        return body

    def _final(self, out: GenerateOutput, finish: str | None) -> dict[str, Any]:
        first = out.first_token_time if out.first_token_time is not None else out.created
        prompt_ns = max(int((first - out.created) * 1e9), 1)
        eval_ns = max(int(out.e2e_latency * 1e9) - prompt_ns, 1)
        body: dict[str, Any] = {
            "done": True, "done_reason": finish or "stop",
            "total_duration": max(time.monotonic_ns() - self.start_ns, prompt_ns + eval_ns),
            "load_duration": 0,
            "prompt_eval_count": out.prompt_tokens, "prompt_eval_duration": prompt_ns,
            "eval_count": out.completion_tokens, "eval_duration": eval_ns}
        if self.context_ids is not None:
            body["context"] = self.context_ids + self.output_ids
        return body
