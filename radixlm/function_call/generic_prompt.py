"""The generic tool prompt, for chat templates with no place for tools (see generic.py).

`generic_messages` rewrites a conversation for such a template: the tools go
into the system message, past assistant calls become the JSON the generic
format writes, and `tool` results become user turns (templates without a
`tool` role reject it, and many insist on alternating user / assistant).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from radixlm.function_call.generic import GenericParser
from radixlm.function_call.types import ToolCall, ToolChoice, ToolSpec


def generic_tool_prompt(
    tools: Sequence[ToolSpec], choice: ToolChoice, *, parallel_tool_calls: bool = True
) -> str:
    """System text that lists the tools and asks for the generic JSON answer."""
    allowed = choice.allowed_tools(tools)
    listing = json.dumps(
        [
            {"name": t.name, **({"description": t.description} if t.description else {}),
             "parameters": dict(t.parameters)}
            for t in allowed
        ],
        ensure_ascii=False,
        indent=1,
    )
    how_many = "one or more calls" if parallel_tool_calls else "exactly one call"
    call_form = '{"tool_calls": [{"name": "<function name>", "arguments": {<its arguments>}}]}'
    lines = [
        "You can call these functions (each with a JSON schema of its arguments):",
        listing,
        "",
    ]
    if choice.mode == "named":
        named = f'{{"tool_calls": [{{"name": "{choice.name}", "arguments": {{<its arguments>}}}}]}}'
        lines += [f"Call the function {choice.name}: answer with this JSON object only:", named]
    elif choice.mode == "required":
        lines += [f"Call functions ({how_many}): answer with this JSON object only:", call_form]
    else:
        lines += [
            "Answer with one JSON object and nothing else: either, to call functions "
            f"({how_many}),",
            call_form,
            "or, to answer the user directly,",
            '{"content": "<your answer>"}',
        ]
    return "\n".join(lines)


def generic_messages(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[ToolSpec],
    choice: ToolChoice,
    *,
    parallel_tool_calls: bool = True,
) -> list[dict[str, Any]]:
    """The conversation as a template without tools can render it (a new list)."""
    prompt = generic_tool_prompt(tools, choice, parallel_tool_calls=parallel_tool_calls)
    parser = GenericParser(tools)
    names_by_id: dict[str, str] = {}
    result: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            calls = [_tool_call(c, names_by_id) for c in message["tool_calls"]]
            text = parser.render(_text(message.get("content")), calls)
            result.append({"role": "assistant", "content": text})
        elif role == "tool":
            call_id = str(message.get("tool_call_id", ""))
            entry = {"tool_call_id": call_id, "name": names_by_id.get(call_id, ""),
                     "content": _text(message.get("content"))}
            _append_user(result, "Tool result: " + json.dumps(entry, ensure_ascii=False))
        elif role == "user":
            _append_user(result, message.get("content"), dict(message))
        else:
            result.append(dict(message))
    if result and result[0].get("role") == "system":
        result[0] = {**result[0], "content": f"{_text(result[0].get('content'))}\n\n{prompt}"}
    else:
        result.insert(0, {"role": "system", "content": prompt})
    return result


def _tool_call(call: Mapping[str, Any], names_by_id: dict[str, str]) -> ToolCall:
    function = call.get("function") or {}
    name = str(function.get("name", ""))
    arguments = function.get("arguments") or "{}"
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    if call.get("id"):
        names_by_id[str(call["id"])] = name
    return ToolCall(name, arguments)


def _text(content: object) -> str:
    """A message's text: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(
            str(part.get("text", "")) for part in content
            if isinstance(part, Mapping) and part.get("type") == "text"
        )
    return str(content)


def _append_user(result: list[dict[str, Any]], content: object,
                 message: dict[str, Any] | None = None) -> None:
    """A user turn; one right after another user turn (a tool result) joins it."""
    last = result[-1] if result else None
    if last is not None and last.get("role") == "user" and isinstance(last.get("content"), str) \
            and isinstance(content, str | None):
        last["content"] = f"{last['content']}\n\n{content or ''}"
        return
    result.append({**(message or {}), "role": "user", "content": content})
