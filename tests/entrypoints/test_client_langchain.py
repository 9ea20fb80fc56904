"""`langchain-openai` against the session's real server (default model): structured
output (json_schema and function_calling), a tool loop with a tool result, and
streaming (text, and a call's chunks)."""

from __future__ import annotations

from typing import Any

import pytest
from _clients import CITY_PROMPT, MAX_TOKENS, MODEL, QUESTION, WEATHER_RESULT, CityInfo
from _server_process import API_KEY
from langchain_core.messages import AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI


@tool
def get_weather(city: str) -> str:
    """Get the current weather of a city."""
    return WEATHER_RESULT


def _llm(server: Any, **kwargs: Any) -> ChatOpenAI:
    return ChatOpenAI(model=MODEL, base_url=server.url + "/v1", api_key=API_KEY,
                      temperature=0, max_retries=0, timeout=120, **kwargs)


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output(server: Any, method: str) -> None:
    llm = _llm(server, max_completion_tokens=MAX_TOKENS)
    city = llm.with_structured_output(CityInfo, method=method).invoke(CITY_PROMPT)
    assert isinstance(city, CityInfo)


def test_tool_loop(server: Any) -> None:
    llm = _llm(server, max_completion_tokens=MAX_TOKENS)
    messages: list[Any] = [HumanMessage(QUESTION)]
    ai = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(messages)
    [call] = ai.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
    messages += [ai, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    answer = llm.bind_tools([get_weather], tool_choice="none").invoke(messages)
    assert isinstance(answer.content, str) and answer.content and not answer.tool_calls


def test_streaming(server: Any) -> None:
    llm = _llm(server, max_completion_tokens=12)
    chunks = list(llm.stream("Say hello."))
    assert "".join(str(c.content) for c in chunks)
    forced = _llm(server, max_completion_tokens=MAX_TOKENS).bind_tools(
        [get_weather], tool_choice="get_weather")
    total: AIMessageChunk | None = None
    for chunk in forced.stream(QUESTION):
        total = chunk if total is None else total + chunk  # type: ignore[assignment]
    assert total is not None
    [call] = total.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
