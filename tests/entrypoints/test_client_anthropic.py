"""The `anthropic` client against the session's real server (default model), on the
Messages API: structured output (`messages.parse`), a tool loop with a tool result,
streaming (text and a tool call), token counting, and errors as the client reads them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from _clients import (
    CITY_PROMPT,
    MAX_TOKENS,
    QUESTION,
    WEATHER_RESULT,
    WEATHER_SCHEMA,
)
from _server_process import API_KEY
from pydantic import BaseModel

MODEL = "claude-radixlm"
TOOLS: list[Any] = [{"name": "get_weather", "description": "Get the current weather of a city.",
                     "input_schema": WEATHER_SCHEMA}]
GREEDY = {"temperature": 0}  # not a parameter of this client version: sent as extra_body


@pytest.fixture(scope="module")
def claude(server: Any) -> Iterator[anthropic.Anthropic]:
    # The client sends the key as x-api-key, and anthropic-version.
    with anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0,
                             timeout=120) as client:
        yield client


class CityFacts(BaseModel):
    name: str
    country: str
    population: int


def test_structured_output(claude: anthropic.Anthropic) -> None:
    # NOTE: the client drops bounds from the schema it sends (Anthropic's structured outputs
    # have none) and checks them itself, so this model has none: the server's own bounds
    # (a 64-bit integer) end the number.
    message = claude.messages.parse(model=MODEL, max_tokens=MAX_TOKENS, extra_body=GREEDY,
                                    messages=[{"role": "user", "content": CITY_PROMPT}],
                                    output_format=CityFacts)
    assert isinstance(message.parsed_output, CityFacts)


def test_tool_loop(claude: anthropic.Anthropic) -> None:
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    first = claude.messages.create(
        model=MODEL, max_tokens=MAX_TOKENS, messages=messages, tools=TOOLS, extra_body=GREEDY,
        tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert first.stop_reason == "tool_use"
    [call] = [b for b in first.content if b.type == "tool_use"]
    assert call.name == "get_weather" and isinstance(call.input["city"], str)
    messages += [{"role": "assistant", "content": first.content},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                               "content": WEATHER_RESULT}]}]
    answer = claude.messages.create(model=MODEL, max_tokens=24, messages=messages, tools=TOOLS,
                                    tool_choice={"type": "none"}, extra_body=GREEDY)
    assert [b.type for b in answer.content] == ["text"] and answer.content[0].text
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert answer.usage.input_tokens + (answer.usage.cache_read_input_tokens or 0) > 0


def test_streaming(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(model=MODEL, max_tokens=12,
                                messages=[{"role": "user", "content": "Say hello."}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text
    assert final.stop_reason in ("end_turn", "max_tokens") and final.usage.output_tokens > 0
    with claude.messages.stream(model=MODEL, max_tokens=MAX_TOKENS, tools=TOOLS,
                                extra_body=GREEDY, messages=[{"role": "user", "content": QUESTION}],
                                tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert "input_json" in events
    [call] = final.content
    assert call.type == "tool_use" and isinstance(call.input["city"], str)
    assert final.stop_reason == "tool_use"


def test_count_tokens_and_errors(claude: anthropic.Anthropic) -> None:
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    count = claude.messages.count_tokens(model=MODEL, messages=messages, tools=TOOLS)
    plain = claude.messages.count_tokens(model=MODEL, messages=messages)
    assert count.input_tokens > plain.input_tokens > 0
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(model=MODEL, max_tokens=8, messages=[])
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    wrong = claude.with_options(api_key="wrong")
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model=MODEL, max_tokens=8, messages=messages)
