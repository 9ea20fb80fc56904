"""POST /v1/responses requests, translated to a chat request (OpenAI's Responses API).

    input: str | [item]          → messages (items below), after `instructions` as system
      {"role", "content": str | [part]} / {"type": "message", ...}
          parts: input_text / output_text → text; input_image {"image_url"} → image
      {"type": "function_call", "call_id", "name", "arguments"} → an assistant tool call
      {"type": "function_call_output", "call_id", "output"}     → a tool message
      {"type": "reasoning", ...}                                → dropped (not replayed)
    max_output_tokens → max_tokens; temperature, top_p, seed, stop...: the same
    text.format {"type": "json_schema", "name", "schema", "strict"} | {"type":
        "json_object"} | {"type": "text"} → response_format
    tools [{"type": "function", "name", "description", "parameters"}] → chat tools
    tool_choice "auto" | "none" | "required" | {"type": "function", "name"}
    previous_response_id → the stored conversation it ended, then `input`
        (response_store.py; `instructions` are not carried over, as in OpenAI's API)
    thinking_token_budget (vLLM's), reasoning.max_tokens → thinking_token_budget
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, ValidationError

from radixlm.entrypoints.http.errors import APIError, validation_error
from radixlm.entrypoints.http.strict import StrictModel
from radixlm.entrypoints.openai.protocol import ChatCompletionRequest


class ResponsesRequest(StrictModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    text: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    reasoning: dict[str, Any] | None = None
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    # Extras, as on chat
    seed: int | None = None
    top_k: int | None = None
    stop: str | list[str] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tool_call_constrained: bool | None = None
    thinking_token_budget: int | None = Field(None, ge=0)

    @property
    def stores(self) -> bool:
        """OpenAI stores responses unless told not to."""
        return self.store is not False


def _parts(content: Any, where: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(f"{where}.content must be a string or a list of parts", param="input")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": part.get("text", "")})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise APIError(f"{where}.content[{j}] needs an image_url (file_id is not "
                               "supported)", param="input")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise APIError(f"{where}.content[{j}] has unsupported type {kind!r} (expected "
                           "input_text, output_text or input_image)", param="input")
    return parts


def input_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The chat messages for `input` (the instructions apart)."""
    messages: list[dict[str, Any]] = []
    if isinstance(req.input, str):
        messages.append({"role": "user", "content": req.input})
        return messages
    for i, item in enumerate(req.input):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise APIError(f"{where}.role must be user, assistant, system or developer",
                               param="input")
            messages.append({"role": role, "content": _parts(item.get("content"), where)})
        elif kind == "function_call":
            call = {"id": item.get("call_id") or item.get("id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments",
                                                                                  "{}")}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": output if isinstance(output, str) else str(output)})
        elif kind != "reasoning":
            raise APIError(f"{where}.type {kind!r} is not supported", param="input")
    return messages


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {
            "name": fmt.get("name"), "schema": fmt.get("schema"), "strict": fmt.get("strict")}}
    raise APIError(f"text.format.type {fmt.get('type')!r} is not supported (text, "
                   "json_object, json_schema)", param="text")


def _tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise APIError(f"tools[{i}].type {tool.get('type')!r} is not supported (only "
                           "function tools)", param="tools")
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: str | dict[str, Any] | None) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def to_chat_request(req: ResponsesRequest, history: list[dict[str, Any]] | None = None,
                    ) -> ChatCompletionRequest:
    """The chat request that serves `req` after the conversation `history` (a previous
    response's); APIError(400) on bad input."""
    messages = list(history or []) + input_messages(req)
    if req.instructions:
        messages.insert(0, {"role": "system", "content": req.instructions})
    if not messages:
        raise APIError("input must hold at least one message", param="input")
    budget = req.thinking_token_budget
    if budget is None and isinstance(req.reasoning, dict):
        budget = req.reasoning.get("max_tokens")
    body: dict[str, Any] = {
        "model": req.model, "messages": messages, "stream": req.stream,
        "thinking_token_budget": budget,
        "max_tokens": req.max_output_tokens, "response_format": _response_format(req.text),
        "tools": _tools(req.tools), "tool_choice": _tool_choice(req.tool_choice),
        "parallel_tool_calls": req.parallel_tool_calls, "seed": req.seed, "stop": req.stop,
        "chat_template_kwargs": req.chat_template_kwargs,
        "tool_call_constrained": req.tool_call_constrained,
    }
    for name in ("temperature", "top_p", "top_k"):
        if getattr(req, name) is not None:
            body[name] = getattr(req, name)
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in body.items()
                                                     if v is not None})
    except ValidationError as e:
        raise validation_error(e) from e
