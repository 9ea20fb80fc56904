"""The `ollama` client against the session's real server (default model), on Ollama's
API: structured output (`format` with a JSON schema), a tool loop with a tool result,
streaming (chat and generate), the model routes, and errors as the client reads them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ollama
import pytest
from _clients import (
    CITY_PROMPT,
    MAX_TOKENS,
    QUESTION,
    CityInfo,
    get_weather,
)
from _server_process import AUTH

OPTIONS = {"temperature": 0, "num_predict": MAX_TOKENS}


@pytest.fixture(scope="module")
def client(server: Any) -> Iterator[ollama.Client]:
    yield ollama.Client(host=server.url, headers=AUTH, timeout=120)


@pytest.fixture(scope="module")
def name(client: ollama.Client) -> str:
    [model] = client.list().models
    assert model.model
    return model.model


def test_model_routes(client: ollama.Client, name: str) -> None:
    show = client.show(name)
    assert show.capabilities is not None and "tools" in show.capabilities
    assert client.ps().models[0].context_length
    with pytest.raises(ollama.ResponseError) as e:
        client.show("no-such-model")
    assert e.value.status_code == 404


def test_structured_output(client: ollama.Client, name: str) -> None:
    r = client.chat(model=name, messages=[{"role": "user", "content": CITY_PROMPT}],
                    format=CityInfo.model_json_schema(), options=OPTIONS)
    assert r.message.content is not None
    CityInfo.model_validate_json(r.message.content)
    g = client.generate(model=name, prompt=CITY_PROMPT, format="json", options=OPTIONS)
    assert isinstance(g.context, list) and g.eval_count


def test_tool_loop(client: ollama.Client, name: str) -> None:
    # (Ollama has no tool_choice: the question asks for the tool, and the generic format's
    # grammar makes whatever the model chooses parse)
    messages: list[Any] = [{"role": "user", "content": "Call get_weather: " + QUESTION}]
    first = client.chat(model=name, messages=messages, tools=[get_weather], options=OPTIONS)
    calls = first.message.tool_calls or []
    assert calls, first.message
    assert all(c.function.name == "get_weather" for c in calls)
    assert all(isinstance(c.function.arguments["city"], str) for c in calls)
    messages.append(first.message)
    messages += [{"role": "tool", "tool_name": c.function.name,
                  "content": get_weather(**c.function.arguments)} for c in calls]
    answer = client.chat(model=name, messages=messages, options={**OPTIONS, "num_predict": 24})
    assert answer.message.content and not answer.message.tool_calls


def test_streaming(client: ollama.Client, name: str) -> None:
    parts = list(client.chat(model=name, messages=[{"role": "user", "content": "Say hello."}],
                             options={"num_predict": 12}, stream=True))
    assert "".join(p.message.content or "" for p in parts)
    assert parts[-1].done and parts[-1].done_reason in ("stop", "length")
    assert parts[-1].eval_count and parts[-1].eval_duration
    pieces = list(client.generate(model=name, prompt="Once upon a time", raw=True,
                                  options={"num_predict": 6}, stream=True))
    assert "".join(p.response or "" for p in pieces) and pieces[-1].done
    with pytest.raises(ollama.ResponseError) as e:
        list(client.chat(model=name, messages=[{"role": "user", "content": "Hi"}],
                         options={"num_ctx": 10**7}, stream=True))
    assert e.value.status_code == 400 and "num_ctx" in e.value.error
