"""`litellm` against the session's real server (default model), through its OpenAI
provider (structured output, a tool loop with a tool result, streaming) and its
Anthropic provider (/v1/messages: a tool loop, streaming)."""

from __future__ import annotations

import json
import os
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch at import

import litellm  # noqa: E402
from _clients import (  # noqa: E402
    CITY_PROMPT,
    MAX_TOKENS,
    MODEL,
    OPENAI_TOOLS,
    QUESTION,
    WEATHER_RESULT,
    CityInfo,
)
from _server_process import API_KEY  # noqa: E402


def _openai(server: Any) -> dict[str, Any]:
    return {"model": f"openai/{MODEL}", "api_base": server.url + "/v1", "api_key": API_KEY,
            "temperature": 0, "num_retries": 0, "timeout": 120}


def _anthropic(server: Any) -> dict[str, Any]:
    return {"model": "anthropic/claude-radixlm", "api_base": server.url, "api_key": API_KEY,
            "temperature": 0, "num_retries": 0, "timeout": 120}


def _tool_loop(kwargs: dict[str, Any]) -> None:
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    first = litellm.completion(messages=messages, tools=OPENAI_TOOLS, max_tokens=MAX_TOKENS,
                               tool_choice={"type": "function",
                                            "function": {"name": "get_weather"}}, **kwargs)
    [call] = first.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    messages += [first.choices[0].message.model_dump(),
                 {"role": "tool", "tool_call_id": call.id, "content": WEATHER_RESULT}]
    second = litellm.completion(messages=messages, tools=OPENAI_TOOLS, tool_choice="none",
                                max_tokens=24, **kwargs)
    assert second.choices[0].message.content
    assert not second.choices[0].message.tool_calls


def _stream(kwargs: dict[str, Any]) -> None:
    chunks = list(litellm.completion(messages=[{"role": "user", "content": "Say hello."}],
                                     max_tokens=12, stream=True, **kwargs))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_structured_output(server: Any) -> None:
    r = litellm.completion(messages=[{"role": "user", "content": CITY_PROMPT}],
                           response_format=CityInfo, max_tokens=MAX_TOKENS, **_openai(server))
    CityInfo.model_validate_json(r.choices[0].message.content)


def test_tool_loop(server: Any) -> None:
    _tool_loop(_openai(server))


def test_streaming(server: Any) -> None:
    _stream(_openai(server))


def test_anthropic_provider_tool_loop_and_streaming(server: Any) -> None:
    _tool_loop(_anthropic(server))
    _stream(_anthropic(server))
