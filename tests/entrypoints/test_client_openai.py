"""The `openai` client against the session's real server (default model): structured
output, a tool loop with a tool result, and streaming (text and a call)."""

from __future__ import annotations

import json
from typing import Any

from _clients import (
    CITY_PROMPT,
    MAX_TOKENS,
    MODEL,
    OPENAI_TOOLS,
    QUESTION,
    WEATHER_RESULT,
    CityInfo,
)


def test_structured_output(oai: Any) -> None:
    completion = oai.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": CITY_PROMPT}],
        response_format=CityInfo, max_tokens=MAX_TOKENS, temperature=0)
    city = completion.choices[0].message.parsed
    assert isinstance(city, CityInfo)
    response = oai.responses.parse(model=MODEL, input=CITY_PROMPT, text_format=CityInfo,
                                   max_output_tokens=MAX_TOKENS, temperature=0)
    assert isinstance(response.output_parsed, CityInfo)


def test_tool_loop(oai: Any) -> None:
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    first = oai.chat.completions.create(
        model=MODEL, messages=messages, tools=OPENAI_TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_tokens=MAX_TOKENS, temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    messages += [choice.message, {"role": "tool", "tool_call_id": call.id,
                                  "content": WEATHER_RESULT}]
    second = oai.chat.completions.create(
        model=MODEL, messages=messages, tools=OPENAI_TOOLS, tool_choice="none",
        max_tokens=24, temperature=0)
    answer = second.choices[0]
    assert answer.message.content and not answer.message.tool_calls
    assert answer.finish_reason in ("stop", "length")


def test_streaming(oai: Any) -> None:
    stream = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=12,
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    # A streamed call: one entry per call index in each chunk (as OpenAI sends them),
    # whose fragments join into the call's arguments.
    stream = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], tools=OPENAI_TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=MAX_TOKENS, temperature=0, stream=True)
    arguments, names = "", []
    for chunk in stream:
        entries = chunk.choices[0].delta.tool_calls or [] if chunk.choices else []
        assert len({e.index for e in entries}) == len(entries), entries
        for e in entries:
            names += [e.function.name] if e.function and e.function.name else []
            arguments += e.function.arguments or "" if e.function else ""
    assert names == ["get_weather"]
    assert isinstance(json.loads(arguments)["city"], str)
