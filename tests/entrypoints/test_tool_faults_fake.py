"""Issue 32's tool-call faults 2-4, through the real openai client, on the fake runtime.

The fake "generates" a recorded model text (cycled, one byte per token), so each
report can be replayed exactly: the openai client's own streaming accumulation,
and instructor's way of reading `delta.tool_calls[0]`, on the generic format (the
default template has no place for tools) and on Hermes (`--chat-template hermes`).

- fault 2: one delta entry per call index per chunk, so a client reading
  `delta.tool_calls[0]` gets every argument fragment;
- fault 3: an answer cut by max_tokens keeps its complete calls as tool_calls,
  drops the cut call, shows no markup in content and ends "length", streamed
  or not;
- fault 4: an answer that repeats a call ends there ("tool_calls", the repeat
  dropped, the generation stopped long before max_tokens); at most
  --max-tool-calls-per-turn calls; exactly one with parallel_tool_calls false.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from _fake_runtime import FakeTokenizerManager, byte_tokenizer, fake_starter
from starlette.testclient import TestClient

from radixlm.entrypoints.http.server import create_app
from radixlm.server_args import ServerArgs

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}},
]
ASK = [{"role": "user", "content": "Time in UTC and weather in Paris?"}]
TIME_ARGS, WEATHER_ARGS = '{"zone": "UTC"}', '{"city": "Paris"}'
HERMES = (f'<tool_call>\n{{"name": "get_time", "arguments": {TIME_ARGS}}}\n</tool_call>\n'
          f'<tool_call>\n{{"name": "get_weather", "arguments": {WEATHER_ARGS}}}\n</tool_call>')
GENERIC = (f'{{"tool_calls": [{{"name": "get_time", "arguments": {TIME_ARGS}}}, '
           f'{{"name": "get_weather", "arguments": {WEATHER_ARGS}}}]}}')
FORMATS = {"hermes": (HERMES, "hermes"), "generic": (GENERIC, None)}


def _serve(reply: str, delay: float = 0.0, **args: Any
           ) -> Iterator[tuple[openai.OpenAI, FakeTokenizerManager]]:
    tm = FakeTokenizerManager(byte_tokenizer(), context_length=8192, reply=reply, delay=delay)
    app = create_app(ServerArgs(served_model_name="fake", **args), fake_starter(tm))
    with TestClient(app, raise_server_exceptions=False, base_url="http://localhost") as c:
        for _ in range(1000):
            if c.get("/health").status_code == 200:
                break
        yield openai.OpenAI(base_url="http://localhost/v1", api_key="x", http_client=c,
                            max_retries=0), tm


@pytest.fixture(params=list(FORMATS))
def served(request: pytest.FixtureRequest) -> Iterator[tuple[openai.OpenAI, Any, str]]:
    reply, template = FORMATS[request.param]
    args = {"chat_template": template} if template else {}
    for client, tm in _serve(reply + "$", **args):
        yield client, tm, reply


def _ask(client: openai.OpenAI, **kw: Any) -> Any:
    return client.chat.completions.create(model="m", messages=ASK, tools=TOOLS,  # type: ignore[arg-type]
                                          temperature=0, stop="$", **kw)


# -- fault 2: one entry per index per chunk --------------------------------------------


def test_each_chunk_has_one_entry_per_call_index(served: Any) -> None:
    client, _, reply = served
    chunks = list(_ask(client, max_tokens=len(reply) + 1, stream=True))
    calls_per_chunk = [c.choices[0].delta.tool_calls for c in chunks
                       if c.choices and c.choices[0].delta.tool_calls]
    assert calls_per_chunk
    for entries in calls_per_chunk:
        indices = [e.index for e in entries]
        assert len(indices) == len(set(indices)), entries
    # instructor's create_partial (TOOLS) reads delta.tool_calls[0] of every chunk:
    # with a single call nothing is lost.
    single = _ask(client, max_tokens=len(reply) + 1, stream=True, parallel_tool_calls=False)
    fragments = [c.choices[0].delta.tool_calls[0].function.arguments or "" for c in single
                 if c.choices and c.choices[0].delta.tool_calls]
    assert json.loads("".join(fragments)) == json.loads(TIME_ARGS)
    # The openai client's own accumulation (the stream helper) parses every call.
    with client.chat.completions.stream(model="m", messages=ASK, tools=TOOLS,  # type: ignore[arg-type]
                                        max_tokens=len(reply) + 1, stop="$") as stream:
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_time", {"zone": "UTC"}), ("get_weather", {"city": "Paris"})]
    assert final.choices[0].finish_reason == "tool_calls"


# -- fault 3: cut by max_tokens -----------------------------------------------------------


def test_a_cut_answer_keeps_its_complete_calls(served: Any) -> None:
    client, _, reply = served
    cut = reply.index('"Paris"') + 3  # inside the second call's arguments
    reply_body = _ask(client, max_tokens=cut)
    choice = reply_body.choices[0]
    assert choice.finish_reason == "length"
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls
            ] == [("get_time", TIME_ARGS)]
    assert not choice.message.content  # no markup, no raw JSON
    content, calls, finish = "", {}, None
    for chunk in _ask(client, max_tokens=cut, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for d in delta.tool_calls or []:
            entry = calls.setdefault(d.index, {"name": "", "arguments": ""})
            entry["name"] += d.function.name or ""
            entry["arguments"] += d.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "length" and not content
    assert list(calls.values()) == [{"name": "get_time", "arguments": TIME_ARGS}]
    # The openai client's accumulation: its snapshot holds the complete call only (it
    # refuses a "length" answer's final parse by itself).
    with client.chat.completions.stream(model="m", messages=ASK, tools=TOOLS,  # type: ignore[arg-type]
                                        max_tokens=cut, stop="$") as stream:
        for _ in stream:
            pass
        snapshot = stream.current_completion_snapshot
    snapped = snapshot.choices[0].message.tool_calls or []
    assert [(c.function.name, c.function.arguments) for c in snapped] == [
        ("get_time", TIME_ARGS)]


# -- fault 4: runaway calls -------------------------------------------------------------


REPEAT = f'<tool_call>\n{{"name": "get_time", "arguments": {TIME_ARGS}}}\n</tool_call>\n'
GENERIC_REPEAT = f'{{"tool_calls": [{{"name": "get_time", "arguments": {TIME_ARGS}}}'


@pytest.mark.parametrize("template, reply", [("hermes", REPEAT), (None, GENERIC_REPEAT)])
def test_a_repeated_call_ends_the_answer(template: str | None, reply: str) -> None:
    # The model repeats the same call until max_tokens (the default 135M model does).
    looping = reply + "".join(f', {{"name": "get_time", "arguments": {TIME_ARGS}}}'
                              for _ in range(200)) if template is None else reply
    args = {"chat_template": template} if template else {}
    # NOTE: a token per millisecond, so that 4000 tokens would take seconds: the stop must
    # come from the server, within a few tokens of the repeat (the abort's round trip).
    for client, tm in _serve(looping, delay=0.001, **args):
        for choice in ("required", "auto"):
            body = client.chat.completions.create(
                model="m", messages=ASK, tools=TOOLS, tool_choice=choice,  # type: ignore[arg-type]
                max_tokens=4000)
            message = body.choices[0].message
            assert body.choices[0].finish_reason == "tool_calls"
            assert [c.function.name for c in message.tool_calls or []] == ["get_time"]
            assert body.usage is not None and body.usage.completion_tokens < 1000
            chunks = list(client.chat.completions.create(
                model="m", messages=ASK, tools=TOOLS, tool_choice=choice,  # type: ignore[arg-type]
                max_tokens=4000, stream=True, stream_options={"include_usage": True}))
            finishes = [c.choices[0].finish_reason for c in chunks
                        if c.choices and c.choices[0].finish_reason]
            assert finishes == ["tool_calls"]
            streamed = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
            assert [d.function.name for d in streamed] == ["get_time"]
            usage = chunks[-1].usage
            assert usage is not None and usage.completion_tokens < 1000
        assert not tm.states  # every generation was stopped, none runs on


def test_the_call_limit_and_parallel_tool_calls_false() -> None:
    distinct = "".join(f'<tool_call>\n{{"name": "get_time", "arguments": {{"zone": "Z{i}"}}}}'
                       f"\n</tool_call>\n" for i in range(10))
    for client, _ in _serve(distinct, chat_template="hermes", max_tool_calls_per_turn=3):
        body = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS,  # type: ignore[arg-type]
                                              max_tokens=4000)
        calls = body.choices[0].message.tool_calls or []
        assert [json.loads(c.function.arguments)["zone"] for c in calls] == ["Z0", "Z1", "Z2"]
        assert body.choices[0].finish_reason == "tool_calls"
        one = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS,  # type: ignore[arg-type]
                                             max_tokens=4000, parallel_tool_calls=False,
                                             stream=True)
        names = [d.function.arguments for c in one if c.choices
                 for d in c.choices[0].delta.tool_calls or []]
        assert names == ['{"zone": "Z0"}']
