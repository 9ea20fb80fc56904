"""An Anthropic Messages request → the OpenAI chat request the OpenAI layer runs.

The conversation and every option map onto OpenAI's chat fields, so the chat
template, the tool prompt and grammar (tools.py), the reasoning parser and
the sampling validation are the OpenAI routes' own:

    system (a string or text blocks)      → a first "system" message
    user text / image blocks              → a user message with text / image_url parts
    user tool_result blocks               → one "tool" message each (before the user's text)
    assistant text / tool_use blocks      → an assistant message with content / tool_calls
    assistant thinking blocks             → its reasoning_content (templates that keep it)
    a final assistant message             → continue_final_message (Anthropic's prefill)
    tools [{name, description, input_schema}]        → tools [{type: function, ...}]
    tool_choice auto / any / tool / none  → "auto" / "required" / named / "none";
                                            disable_parallel_tool_use → parallel_tool_calls
    max_tokens, stop_sequences, temperature, top_p, top_k, metadata.user_id
                                          → max_tokens, stop, temperature, top_p, top_k, user
    thinking enabled / disabled           → chat_template_kwargs.enable_thinking, and
                                            budget_tokens → thinking_token_budget
    output_format / output_config.format  → response_format json_schema

A tool_result's `is_error` is said in the tool message's text ("Error: ..."),
the way Anthropic's own templates present it to the model.
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.entrypoints.anthropic.protocol import (
    ConversationRequest,
    ImageBlock,
    Message,
    MessagesRequest,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolChoice,
    ToolResultBlock,
    ToolUseBlock,
)
from radixlm.entrypoints.http.errors import APIError


def chat_request_dict(req: ConversationRequest, stream: bool = False,
                      thinks: bool = True) -> dict[str, Any]:
    """The OpenAI chat request body for `req` (validated as ChatCompletionRequest next).

    thinks: the server has a reasoning parser; without one a thinking budget has no
    think block to bound, and is not sent (Anthropic's clients, Claude Code among them,
    ask for thinking whatever the model)."""
    messages = _system(req.system) + [m for i, msg in enumerate(req.messages)
                                      for m in _message(msg, i)]
    body: dict[str, Any] = {"model": req.model, "messages": messages, "stream": stream}
    if req.tools is not None:
        body["tools"] = [{"type": "function", "function": {
            "name": t.name, **({"description": t.description} if t.description else {}),
            "parameters": t.input_schema}} for t in req.tools]
    if req.tool_choice is not None:
        body["tool_choice"] = _tool_choice(req.tool_choice)
        body["parallel_tool_calls"] = not req.tool_choice.disable_parallel_tool_use
    kwargs: dict[str, Any] = {}
    if req.thinking is not None:
        kwargs["enable_thinking"] = req.thinking.type != "disabled"
        if req.thinking.type == "enabled" and thinks:
            body["thinking_token_budget"] = req.thinking.budget_tokens
    if req.output_config is not None and req.output_config.effort is not None:
        kwargs["reasoning_effort"] = req.output_config.effort
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    schema = req.json_schema
    if schema is not None:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "output", "schema": schema}}
    if isinstance(req, MessagesRequest):
        _sampling(req, body)
    last = req.messages[-1]
    if last.role == "assistant" and "tool_calls" not in messages[-1]:
        body["continue_final_message"] = True  # a prefill: the answer continues it
    return body


def _sampling(req: MessagesRequest, body: dict[str, Any]) -> None:
    body["max_tokens"] = req.max_tokens
    if req.stop_sequences:
        body["stop"] = req.stop_sequences
    for name in ("temperature", "top_p", "top_k"):
        value = getattr(req, name)
        if value is not None:
            body[name] = value
    if req.metadata is not None and req.metadata.user_id is not None:
        body["user"] = req.metadata.user_id


def _system(system: str | list[TextBlock] | None) -> list[dict[str, Any]]:
    if system is None:
        return []
    text = system if isinstance(system, str) else "\n\n".join(b.text for b in system)
    return [{"role": "system", "content": text}] if text else []


def _tool_choice(choice: ToolChoice) -> Any:
    if choice.type == "any":
        return "required"
    if choice.type == "tool":
        return {"type": "function", "function": {"name": choice.name}}
    return choice.type  # "auto" | "none"


def _message(msg: Message, position: int) -> list[dict[str, Any]]:
    if isinstance(msg.content, str):
        return [{"role": msg.role, "content": msg.content}]
    if msg.role == "user":
        return _user_message(msg, position)
    return [_assistant_message(msg, position)]


def _user_message(msg: Message, position: int) -> list[dict[str, Any]]:
    assert not isinstance(msg.content, str)
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(msg.content):
        if isinstance(block, ToolResultBlock):
            results.append({"role": "tool", "tool_call_id": block.tool_use_id,
                            "content": _tool_result_text(block)})
            parts.extend(_tool_result_images(block))
        elif isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            parts.append({"type": "image_url", "image_url": {"url": block.source.as_url}})
        else:
            raise APIError(f"messages[{position}].content[{j}]: a user message cannot hold a "
                           f"{block.type!r} block", param="messages")
    if parts or not results:
        results.append({"role": "user", "content": _parts_or_text(parts)})
    return results


def _assistant_message(msg: Message, position: int) -> dict[str, Any]:
    assert not isinstance(msg.content, str)
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(msg.content):
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            calls.append({"id": block.id, "type": "function", "function": {
                "name": block.name, "arguments": json.dumps(block.input, ensure_ascii=False)}})
        elif isinstance(block, ThinkingBlock):
            reasoning.append(block.thinking)
        elif isinstance(block, RedactedThinkingBlock):
            continue  # opaque to any model but the one that wrote it
        else:
            raise APIError(f"messages[{position}].content[{j}]: an assistant message cannot "
                           f"hold a {block.type!r} block", param="messages")
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        out["tool_calls"] = calls
    if reasoning:
        out["reasoning_content"] = "".join(reasoning)
    return out


def _tool_result_text(block: ToolResultBlock) -> str:
    if block.content is None:
        text = ""
    elif isinstance(block.content, str):
        text = block.content
    else:
        text = "\n".join(p.text for p in block.content if isinstance(p, TextBlock))
    return f"Error: {text}" if block.is_error else text


def _tool_result_images(block: ToolResultBlock) -> list[dict[str, Any]]:
    if not isinstance(block.content, list):
        return []
    return [{"type": "image_url", "image_url": {"url": p.source.as_url}}
            for p in block.content if isinstance(p, ImageBlock)]


def _parts_or_text(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Text-only content as one string (what every template takes)."""
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts
