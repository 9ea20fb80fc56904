"""Tool calls, the peers' structured-output fields and /v1/responses on the real server.

The default model and no flags (the session's shared server: xgrammar, the
model's own template, which has no place for tools, so the generic format), and
a tool-capable template file (chatml with Hermes tools) on llguidance and on
xgrammar. Every call's arguments are validated with jsonschema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from _server_process import API_KEY, ServerProcess

from radixlm.chat_template import BUILTIN_TEMPLATES

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 20},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 12}},
        "required": ["zone"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a "
                                      "city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a zone",
                                      "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _check_calls(calls: list[Any], names: set[str]) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def _stream_calls(stream: Any) -> tuple[str, dict[int, dict[str, str]], str | None]:
    """Joined content, per index the call's id, name and joined arguments, finish."""
    content, calls, finish = "", {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for d in choice.delta.tool_calls or []:
            entry = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
            if d.id:
                assert not entry["id"], "a call's id came twice"
                entry["id"], entry["name"] = d.id, d.function.name
            entry["arguments"] += d.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, calls, finish


def _tool_requests(client: Any, **extra: Any) -> None:
    """required and named, non-streaming and streaming: calls that validate."""
    for choice in ("required", NAMED):
        names = {"get_weather"} if choice is NAMED else set(SCHEMAS)
        reply = client.chat.completions.create(
            model="m", messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=80,
            temperature=0, **extra)
        message = reply.choices[0].message
        assert reply.choices[0].finish_reason == "tool_calls", message
        _check_calls(message.tool_calls, names)
        content, calls, finish = _stream_calls(client.chat.completions.create(
            model="m", messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=80,
            temperature=0, stream=True, **extra))
        assert finish == "tool_calls" and not content.strip()
        streamed = [calls[i] for i in sorted(calls)]
        assert [c["name"] for c in streamed] == [c.function.name for c in message.tool_calls]
        assert [c["arguments"] for c in streamed] == [c.function.arguments
                                                      for c in message.tool_calls]
        for c in streamed:
            assert "<tool_call>" not in c["arguments"]
            jsonschema.validate(json.loads(c["arguments"]), SCHEMAS[c["name"]])


# ------------------------------------------------------ the default model, no flags


def test_default_server_required_and_named(oai: Any) -> None:
    _tool_requests(oai)


def test_default_server_auto_and_a_tool_result(oai: Any) -> None:
    reply = oai.chat.completions.create(model="m", messages=ASK, tools=TOOLS, max_tokens=80,
                                        temperature=0)
    message = reply.choices[0].message
    # The generic format constrains auto too: a call that validates, or plain content.
    if message.tool_calls:
        _check_calls(message.tool_calls, set(SCHEMAS))
    else:
        assert message.content
    call = {"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "21 C, sunny"}]
    reply = oai.chat.completions.create(model="m", messages=history, tools=TOOLS,
                                        max_tokens=60, temperature=0)
    answer = reply.choices[0].message
    assert answer.content or answer.tool_calls
    if answer.tool_calls:
        _check_calls(answer.tool_calls, set(SCHEMAS))


@pytest.mark.parametrize("body, words", [
    ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, ["name is required"]),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "nope"}}}}}]},
     ["Tool 0 function has invalid 'parameters' schema"]),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "other"}}},
     ["Tool 'other' not found in tools list."]),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     ["cannot be combined"]),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, ["tool_choice"]),
    ({"tool_choice": "required"}, ["Tools cannot be empty if tool choice is set to required."]),
    ({"regex": "a", "guided_regex": "b"}, ["Only one constraint"]),
    ({"guided_choice": []}, ["at least one"]),
    ({"structured_outputs": {"unknown": 1}}, ["unknown"]),
])
def test_bad_tool_and_constraint_input_is_a_400(oai: Any, body: dict[str, Any],
                                                 words: list[str]) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model="m", messages=ASK, max_tokens=4, extra_body=body)
    for word in words:
        assert word in str(err.value)


CHOICES = ["yes", "no", "maybe (a+b)"]


@pytest.mark.parametrize("body, check", [
    ({"structured_outputs": {"regex": "[0-9]{3}"}}, lambda t: re.fullmatch("[0-9]{3}", t)),
    ({"guided_regex": "(red|green)"}, lambda t: re.fullmatch("(red|green)", t)),
    ({"structured_outputs": {"choice": CHOICES}}, lambda t: t in CHOICES),
    ({"guided_choice": CHOICES}, lambda t: t in CHOICES),
    ({"structured_outputs": {"json": TIME}}, lambda t: jsonschema.validate(json.loads(t), TIME)
     is None),
    ({"guided_json": TIME, "guided_whitespace_pattern": "[ ]?"},
     lambda t: jsonschema.validate(json.loads(t), TIME) is None),
    ({"structured_outputs": {"json_object": True}}, lambda t: isinstance(json.loads(t), dict)),
    ({"guided_grammar": 'root ::= "Hi" | "Hello"'}, lambda t: t in ("Hi", "Hello")),
    ({"structured_outputs": {"grammar": 'root ::= "up" | "down"'}},
     lambda t: t in ("up", "down")),
    ({"grammar": 'root ::= [0-9] [0-9]'}, lambda t: re.fullmatch("[0-9]{2}", t)),  # llama.cpp
])
def test_peer_fields_constrain_chat(oai: Any, body: dict[str, Any], check: Any) -> None:
    reply = oai.chat.completions.create(model="m", messages=ASK, max_tokens=40, temperature=0,
                                        extra_body={**body, "repetition_penalty": 1.2})
    text = reply.choices[0].message.content
    assert check(text), text


def test_peer_fields_constrain_completions(oai: Any) -> None:
    for body in ({"guided_choice": CHOICES}, {"structured_outputs": {"choice": CHOICES}},
                 {"json_schema": TIME, "repetition_penalty": 1.2}):
        text = oai.completions.create(model="m", prompt="Answer:", max_tokens=30,
                                      temperature=0, extra_body=body).choices[0].text
        if "json_schema" in body:
            jsonschema.validate(json.loads(text), TIME)
        else:
            assert text in CHOICES


def test_responses_text_json_schema_and_tool(oai: Any) -> None:
    reply = oai.responses.create(model="m", input="Name a color.", instructions="Be brief.",
                                 max_output_tokens=8, temperature=0)
    assert reply.output_text and reply.usage.output_tokens <= 8
    reply = oai.responses.create(
        model="m", input=[{"role": "user", "content": [
            {"type": "input_text", "text": "What time zone is Paris in? Answer in JSON."}]}],
        max_output_tokens=40, temperature=0,
        text={"format": {"type": "json_schema", "name": "zone", "schema": TIME}})
    jsonschema.validate(json.loads(reply.output_text), TIME)
    flat_tools = [{"type": "function", "name": t["function"]["name"],
                   "parameters": t["function"]["parameters"]} for t in TOOLS]
    reply = oai.responses.create(model="m", input="What is the weather in Paris?",
                                 tools=flat_tools, tool_choice="required",
                                 max_output_tokens=80, temperature=0)
    calls = [item for item in reply.output if item.type == "function_call"]
    assert calls
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    types, args = [], ""
    for event in oai.responses.create(model="m", input="What is the weather in Paris?",
                                      tools=flat_tools, tool_choice="required",
                                      max_output_tokens=80, temperature=0, stream=True):
        types.append(event.type)
        if event.type == "response.function_call_arguments.delta":
            args += event.delta
        if event.type == "response.completed":
            final = event.response
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert "response.output_item.added" in types
    streamed = [item for item in final.output if item.type == "function_call"]
    assert args == "".join(c.arguments for c in streamed)
    for call in streamed:
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    stored = oai.responses.retrieve(final.id)  # store: true by default (OpenAI's)
    assert stored.id == final.id and stored.output_text == final.output_text
    with pytest.raises(openai.NotFoundError):
        oai.responses.create(model="m", input="hi", previous_response_id="resp_1")


# ------------------------------------------------------ a tool-capable template file


@pytest.fixture(scope="module", params=["llguidance", "xgrammar"])
def hermes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Any]:
    folder = Path(tmp_path_factory.mktemp("hermes"))
    template = folder / "hermes_tools.jinja"
    source = BUILTIN_TEMPLATES["hermes"].source
    assert source is not None
    template.write_text(source)
    srv = ServerProcess(folder / "server.log", "--chat-template", str(template),
                        "--grammar-backend", request.param, "--api-key", API_KEY)
    try:
        srv.wait_healthy()
        assert "Tool-call parser: hermes" in srv.log_tail(100_000)
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key=API_KEY, max_retries=0,
                            timeout=120)
    finally:
        srv.stop()


def test_template_file_required_and_named(hermes: Any) -> None:
    # One call per answer: the 135M model would otherwise go on calling until max_tokens.
    _tool_requests(hermes, parallel_tool_calls=False)


def test_template_file_auto_with_constrained_trigger(hermes: Any) -> None:
    nudge = [{"role": "system", "content": "Always call a tool."}] + ASK
    reply = hermes.chat.completions.create(
        model="m", messages=nudge, tools=TOOLS, max_tokens=120, temperature=0,
        parallel_tool_calls=False, extra_body={"tool_call_constrained": True})
    message = reply.choices[0].message
    assert "<tool_call>" not in (message.content or ""), message
    if message.tool_calls:  # the model decides; whatever it calls validates
        _check_calls(message.tool_calls, set(SCHEMAS))
