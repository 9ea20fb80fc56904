"""Ollama requests → the OpenAI chat request the OpenAI layer runs.

    messages (role, content, images)   → OpenAI messages; images (base64) → image_url parts
    assistant tool_calls (arguments    → tool_calls with arguments as JSON text; calls
      as objects)                        without an id get one, and a later `tool` message
                                         naming the function (`tool_name`) answers it
    assistant thinking                 → reasoning_content
    tools                              → tools (tool_choice "auto", as Ollama has no other)
    format "json" / a JSON schema      → response_format json_object / json_schema
    think true / false                 → chat_template_kwargs.enable_thinking
    think "low" | "medium" | "high"    → enable_thinking and reasoning_effort
    options.temperature, top_p, top_k (<= 0: off), min_p, stop, seed (-1: random),
      repeat_penalty, presence_penalty, frequency_penalty
                                       → the same-named OpenAI fields (repetition_penalty)
    options.num_predict                → max_tokens (-1 or -2: to the end of the context)
    /api/generate prompt (+ system, images), unless raw
                                       → a system and a user message

`options.num_ctx` is checked in serving.py once the prompt is known.
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.entrypoints.ollama.protocol import ChatRequest, GenerateRequest, Message, Options


def sampling_fields(options: Options | None, fmt: str | dict[str, Any] | None
                    ) -> dict[str, Any]:
    """The OpenAI sampling and format fields for Ollama's `options` and `format`."""
    o = options or Options.model_validate({})
    body: dict[str, Any] = {}
    for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty"):
        value = getattr(o, name)
        if value is not None:
            body[name] = value
    if o.top_k is not None:
        body["top_k"] = o.top_k if o.top_k > 0 else -1
    if o.stop:
        body["stop"] = o.stop
    if o.seed is not None and o.seed != -1:
        body["seed"] = o.seed
    if o.repeat_penalty is not None:
        body["repetition_penalty"] = o.repeat_penalty
    if o.num_predict is not None and o.num_predict > 0:
        body["max_tokens"] = o.num_predict
    if fmt == "json":
        body["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "format", "schema": fmt}}
    return body


def thinking_fields(think: bool | str | None) -> dict[str, Any]:
    """chat_template_kwargs for `think` (None: the template's default)."""
    if think is None:
        return {}
    kwargs: dict[str, Any] = {"enable_thinking": think is not False}
    if isinstance(think, str):
        kwargs["reasoning_effort"] = think
    return {"chat_template_kwargs": kwargs}


def chat_request_dict(req: ChatRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"model": req.model, "messages": chat_messages(req.messages),
                            "stream": req.stream}
    if req.tools is not None:
        body["tools"] = req.tools
    body.update(sampling_fields(req.options, req.format))
    body.update(thinking_fields(req.think))
    return body


def generate_request_dict(req: GenerateRequest) -> dict[str, Any]:
    """/api/generate (not raw): its prompt as the user's turn of a conversation."""
    messages = [Message(role="system", content=req.system)] if req.system else []
    messages.append(Message(role="user", content=req.prompt, images=req.images))
    body: dict[str, Any] = {"model": req.model, "messages": chat_messages(messages),
                            "stream": req.stream}
    body.update(sampling_fields(req.options, req.format))
    body.update(thinking_fields(req.think))
    return body


def chat_messages(messages: list[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    unanswered: list[tuple[str, str]] = []  # (call id, function name) awaiting a result
    for i, m in enumerate(messages):
        if m.role == "tool":
            out.append(_tool_result(m, unanswered))
            continue
        d: dict[str, Any] = {"role": m.role, "content": _content(m)}
        if m.role == "assistant" and m.tool_calls:
            calls = []
            for j, call in enumerate(m.tool_calls):
                call_id = call.id or f"call_{i}_{j}"
                unanswered.append((call_id, call.function.name))
                calls.append({"id": call_id, "type": "function", "function": {
                    "name": call.function.name,
                    "arguments": json.dumps(call.function.arguments, ensure_ascii=False)}})
            d["tool_calls"] = calls
        if m.role == "assistant" and m.thinking:
            d["reasoning_content"] = m.thinking
        out.append(d)
    return out


def _content(m: Message) -> str | list[dict[str, Any]]:
    if not m.images:
        return m.content
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": image}}
                                   for image in m.images]
    if m.content:
        parts.append({"type": "text", "text": m.content})
    return parts


def _tool_result(m: Message, unanswered: list[tuple[str, str]]) -> dict[str, Any]:
    """A tool message, tied to the call it answers: its tool_call_id, else the first
    unanswered call of its tool_name, else the first unanswered call."""
    match = None
    for k, (call_id, name) in enumerate(unanswered):
        if m.tool_call_id is not None and call_id == m.tool_call_id or (
                m.tool_call_id is None and (m.tool_name is None or name == m.tool_name)):
            match = unanswered.pop(k)
            break
    d: dict[str, Any] = {"role": "tool", "content": m.content,
                         "tool_call_id": m.tool_call_id or (match[0] if match else "")}
    if m.tool_name or match:
        d["name"] = m.tool_name or (match[1] if match else None)
    return d
