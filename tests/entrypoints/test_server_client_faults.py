"""Issue 32 on the real server with the default model, as the faults were found.

The session's shared server (no flags: the model's template has no place for
tools, so the generic format, always constrained, on xgrammar):
- fault 1: a tool whose parameters are a pydantic model with a nested model
  ($defs / $ref) was a 400 for every tool_choice;
- fault 2: a streamed call put two entries with one index in a delta;
- fault 3: an answer cut by max_tokens lost or leaked its calls;
- fault 4: required / auto calls ran until max_tokens or the context (300 s);
- fault 5: `/generate` with {name, population: integer} wrote digits forever.
A second server here (priority scheduling, a KV pool smaller than the context,
hidden states) checks the SGLang parity items that need such flags.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from _server_process import ServerProcess, running_server
from pydantic import BaseModel, Field


class Address(BaseModel):
    city: str = Field(max_length=16)


class User(BaseModel):
    name: str = Field(max_length=16)
    home: Address


USER_SCHEMA = User.model_json_schema()  # {"$defs": {"Address": ...}, "properties": {..$ref..}}
NESTED_TOOL = {"type": "function", "function": {"name": "add_user", "description": "Add a user",
                                                "parameters": USER_SCHEMA}}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
           "required": ["city"], "additionalProperties": False}
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather",
                                                 "parameters": WEATHER}}
ASK_USER = [{"role": "user", "content": "Add the user Ann who lives in Paris."}]
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris and in Rome?"}]


# -- fault 1 ------------------------------------------------------------------------------


def test_nested_models_in_tool_parameters(oai: Any) -> None:
    assert "$defs" in USER_SCHEMA and "$ref" in json.dumps(USER_SCHEMA)
    named = {"type": "function", "function": {"name": "add_user"}}
    for choice in ("auto", "required", named):
        reply = oai.chat.completions.create(
            model="m", messages=ASK_USER, tools=[NESTED_TOOL, WEATHER_TOOL], tool_choice=choice,
            max_tokens=80, temperature=0)
        message = reply.choices[0].message
        if choice != "auto":
            assert message.tool_calls, message
        for call in message.tool_calls or []:
            schema = USER_SCHEMA if call.function.name == "add_user" else WEATHER
            jsonschema.validate(json.loads(call.function.arguments), schema)


# -- fault 2 ------------------------------------------------------------------------------


def test_a_streamed_call_is_one_entry_per_index(oai: Any) -> None:
    chunks = list(oai.chat.completions.create(
        model="m", messages=ASK_USER, tools=[NESTED_TOOL], tool_choice="required",
        max_tokens=80, temperature=0, stream=True, parallel_tool_calls=False))
    entries = [c.choices[0].delta.tool_calls for c in chunks
               if c.choices and c.choices[0].delta.tool_calls]
    assert entries and all(len({e.index for e in es}) == len(es) for es in entries)
    # instructor's create_partial reads delta.tool_calls[0].function.arguments
    args = "".join(es[0].function.arguments or "" for es in entries)
    jsonschema.validate(json.loads(args), USER_SCHEMA)


# -- fault 3 ------------------------------------------------------------------------------


def _streamed(stream: Any) -> tuple[str, list[tuple[str, str]], str | None]:
    content, calls, finish = "", {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for d in delta.tool_calls or []:
            entry = calls.setdefault(d.index, ["", ""])
            entry[0] += d.function.name or ""
            entry[1] += d.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return content, [(n, a) for n, a in calls.values()], finish


def test_an_answer_cut_by_max_tokens(oai: Any) -> None:
    ask: dict[str, Any] = dict(model="m", messages=ASK_WEATHER, tools=[WEATHER_TOOL],
                               tool_choice="required", temperature=0)
    whole = oai.chat.completions.create(max_tokens=200, **ask).choices[0].message.tool_calls
    assert whole
    for max_tokens in (6, 30):  # inside the first call; then past it (where the model goes on)
        reply = oai.chat.completions.create(max_tokens=max_tokens, **ask)
        choice = reply.choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        assert not choice.message.content, choice.message  # never the raw JSON
        content, streamed, finish = _streamed(oai.chat.completions.create(
            max_tokens=max_tokens, stream=True, **ask))
        assert (content, streamed, finish) == ("", calls, choice.finish_reason)
        for name, arguments in calls:  # only complete calls, the answer's own
            jsonschema.validate(json.loads(arguments), WEATHER)
            assert (name, arguments) in [(c.function.name, c.function.arguments) for c in whole]
        if choice.finish_reason == "length":
            assert reply.usage.completion_tokens == max_tokens
        else:
            assert choice.finish_reason == "tool_calls" and calls
    assert oai.chat.completions.create(max_tokens=6, **ask).choices[0].finish_reason == "length"


# -- fault 4 ------------------------------------------------------------------------------


TIME_TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "maxLength": 12}},
    "required": ["zone"], "additionalProperties": False}}}
# Requests on which the default model repeats its call until max_tokens (found so).
LOOPS = [("What is the weather in Paris?", [WEATHER_TOOL], "required"),
         ("What time is it in Tokyo?", [WEATHER_TOOL, TIME_TOOL], "auto")]


@pytest.mark.parametrize("question, tools, choice", LOOPS)
def test_calls_end_without_max_tokens(oai: Any, question: str, tools: list[Any],
                                      choice: str) -> None:
    """No max_tokens: the answer used to run to the end of the context (300 s)."""
    ask = [{"role": "user", "content": question}]
    start = time.monotonic()
    reply = oai.chat.completions.create(model="m", messages=ask, tools=tools,
                                        tool_choice=choice, temperature=0)
    elapsed = time.monotonic() - start
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls", reply
    calls = [(c.function.name, json.loads(c.function.arguments))
             for c in message.tool_calls or []]
    assert 1 <= len(calls) <= 16 and len({json.dumps(c) for c in calls}) == len(calls)
    assert reply.usage.completion_tokens < 500 and elapsed < 120, (reply.usage, elapsed)
    # Streamed (bounded here, so that a regression fails rather than runs for minutes).
    content, streamed, finish = _streamed(oai.chat.completions.create(
        model="m", messages=ask, tools=tools, tool_choice=choice, temperature=0,
        max_tokens=1500, stream=True))
    assert finish == "tool_calls"
    assert [(n, json.loads(a)) for n, a in streamed] == calls


# -- fault 5 ------------------------------------------------------------------------------


CITY = {"type": "object", "properties": {"name": {"type": "string"},
                                         "population": {"type": "integer"}},
        "required": ["name", "population"]}


def test_a_json_schema_integer_ends(http: httpx.Client, oai: Any) -> None:
    r = http.post("/generate", json={
        "text": "Give the name and population of the capital of France as JSON: ",
        "sampling_params": {"json_schema": json.dumps(CITY), "max_new_tokens": 80,
                            "temperature": 0}})
    assert r.status_code == 200, r.text
    value = json.loads(r.json()["text"])  # it was 3152222222... until max_new_tokens
    jsonschema.validate(value, CITY)
    assert abs(value["population"]) < 2**63
    reply = oai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Population of Paris, as JSON?"}],
        max_tokens=80, temperature=0, response_format={"type": "json_schema", "json_schema": {
            "name": "city", "schema": CITY}})
    jsonschema.validate(json.loads(reply.choices[0].message.content), CITY)


# -- parity on the shared server -------------------------------------------------------------


def test_budget_without_reasoning_parser_and_new_metrics(http: httpx.Client) -> None:
    r = http.post("/generate", json={"text": "x", "sampling_params": {
        "thinking_token_budget": 5, "max_new_tokens": 2}})
    assert r.status_code == 400 and "--reasoning-parser" in r.json()["message"]
    text = http.get("/metrics").text
    for name in ("sglang:spec_accept_length", "sglang:realtime_tokens_total",
                 "sglang:forward_execution_seconds_total", "radixlm:realtime_tokens_total"):
        assert name in text, name
    decode = [line for line in text.splitlines()
              if line.startswith('sglang:realtime_tokens_total{') and 'mode="decode"' in line]
    assert decode and float(decode[0].rsplit(" ", 1)[1]) > 0


# -- parity that needs its own flags -----------------------------------------------------------


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = Path(tmp_path_factory.mktemp("parity")) / "server.log"
    with running_server(log, "--max-total-tokens", "700", "--enable-priority-scheduling",
                        "--max-running-requests", "1", "--max-queued-requests", "1",
                        "--enable-return-hidden-states") as srv:
        yield srv


def test_small_pool_chat_hidden_states_and_priority_abort(small: ServerProcess) -> None:
    client = openai.OpenAI(base_url=small.url + "/v1", api_key="x", max_retries=0, timeout=120)
    hi = [{"role": "user", "content": "Hi"}]
    # No max_tokens, a pool (700) smaller than the context (8192): admitted, not a 400.
    reply = client.chat.completions.create(model="m", messages=hi, temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length")
    chunks = list(client.chat.completions.create(model="m", messages=hi, max_tokens=3,
                                                 stream=True,
                                                 extra_body={"return_hidden_states": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert all(d.reasoning_content is None for d in deltas)  # SGLang's null, every delta
    hidden = [d.model_extra.get("hidden_states") for d in deltas
              if (d.model_extra or {}).get("hidden_states") is not None]
    assert len(hidden) == 1 and len(hidden[0]) == 576
    # A full queue: a more urgent request aborts the least urgent waiting one (SGLang's).
    results: dict[str, httpx.Response] = {}
    started = threading.Event()

    def send(name: str, priority: int, tokens: int) -> None:
        body = {"text": "Tell me a story.", "priority": priority,
                "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}
        if name == "long":
            with httpx.stream("POST", small.url + "/generate", timeout=120,
                              json={**body, "stream": True}) as s:
                for line in s.iter_lines():
                    if line.startswith("data: {"):
                        started.set()
            return
        results[name] = httpx.post(small.url + "/generate", json=body, timeout=120)

    threads = [threading.Thread(target=send, args=("long", 0, 200))]
    threads[0].start()
    assert started.wait(60)
    threads.append(threading.Thread(target=send, args=("low", 1, 4)))
    threads[-1].start()
    for _ in range(200):  # "low" waits in the (full) queue
        if httpx.get(small.url + "/get_server_info").json()["num_waiting_reqs"] >= 1:
            break
        time.sleep(0.02)
    threads.append(threading.Thread(target=send, args=("high", 5, 4)))
    threads[-1].start()
    for t in threads:
        t.join(120)
    assert results["high"].status_code == 200, results["high"].text
    assert results["low"].status_code == 503
    assert "aborted by a higher priority request" in results["low"].text
