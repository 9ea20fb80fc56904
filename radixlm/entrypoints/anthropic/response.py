"""A finished Anthropic message: its content blocks, stop reason and usage.

Shared by the whole message (serving.py) and the event stream (stream.py).
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from radixlm.entrypoints.anthropic.protocol import MessagesRequest
from radixlm.entrypoints.openai.serving_chat import ChatJob, is_cut
from radixlm.entrypoints.openai.tools import ChoiceParser
from radixlm.messages.generate_output import GenerateOutput


class StopInfo(NamedTuple):
    reason: str | None
    sequence: str | None


def stop_info(out: GenerateOutput, parser: ChoiceParser, stop_sequences: list[str] | None,
              called: bool) -> StopInfo:
    """Anthropic's stop_reason and stop_sequence for a finished output (`called`: its
    answer holds tool_use blocks)."""
    finish = out.finish_reason
    if parser.stopped:  # the route ended it at a repeated call or the call limit
        return StopInfo("tool_use", None)
    if finish is None:
        return StopInfo(None, None)
    if called and finish.type == "stop":
        return StopInfo("tool_use", None)
    if finish.type == "length":
        return StopInfo("max_tokens", None)
    if isinstance(finish.matched, str) and finish.matched in (stop_sequences or []):
        return StopInfo("stop_sequence", finish.matched)
    return StopInfo("end_turn", None)


def usage(out: GenerateOutput) -> dict[str, int]:
    return {"input_tokens": out.prompt_tokens - out.cached_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": out.cached_tokens,
            "output_tokens": out.completion_tokens}


def call_input(arguments: str) -> dict[str, Any] | None:
    """A call's arguments as tool_use `input`, or None when they are not a whole JSON
    object (the call was cut by max_tokens)."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def message_body(out: GenerateOutput, req: MessagesRequest, job: ChatJob, msg_id: str,
                 model: str) -> dict[str, Any]:
    parser = job.parser()
    finish = out.finish_reason.type if out.finish_reason is not None else None
    parsed = parser.parse_whole(out.text, cut=is_cut(finish))
    calls = []
    for call in parsed.tool_calls:
        arguments = call_input(call["function"]["arguments"])
        if arguments is not None:
            calls.append({"type": "tool_use", "id": call["id"],
                          "name": call["function"]["name"], "input": arguments})
    content: list[dict[str, Any]] = []
    if parsed.reasoning:
        shown = parsed.reasoning if req.shows_thinking else ""
        content.append({"type": "thinking", "thinking": shown, "signature": ""})
    if parsed.content or not calls:
        content.append({"type": "text", "text": parsed.content})
    content.extend(calls)
    stop = stop_info(out, parser, req.stop_sequences, bool(calls))
    return {"id": msg_id, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop.reason, "stop_sequence": stop.sequence,
            "usage": usage(out)}
