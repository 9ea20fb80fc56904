"""The OpenAI layer's tool plan and the peers' fields, without a server."""

from __future__ import annotations

import re

import pytest

from radixlm.entrypoints.http.errors import APIError
from radixlm.entrypoints.openai.agents import AgentSettings
from radixlm.entrypoints.openai.peer_fields import StructuredOutputs, choice_regex, peer_grammars
from radixlm.entrypoints.openai.responses_input import ResponsesRequest, to_chat_request
from radixlm.entrypoints.openai.tools import ChoiceParser, plan_tools

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def _agents(parser: str, constrained: bool = False) -> AgentSettings:
    return AgentSettings(parser, "test", {}, False, None, constrained)


def test_constraint_per_choice_and_backend() -> None:
    hermes = _agents("hermes")
    assert plan_tools(hermes, "xgrammar", TOOLS, "auto", True, None, False).constraint is None
    auto = plan_tools(hermes, "xgrammar", TOOLS, "auto", True, True, False).constraint
    assert auto is not None and auto[0] == "structural_tag"
    flagged = plan_tools(_agents("hermes", True), "llguidance", TOOLS, None, True, None, False)
    assert flagged.constraint is not None and flagged.constraint[0] == "ebnf"
    required = plan_tools(hermes, "outlines", TOOLS, "required", False, None, False)
    assert required.constraint is not None and required.constraint[0] == "regex"
    with pytest.raises(APIError, match="outlines"):  # free text with a trigger: no regex
        plan_tools(hermes, "outlines", TOOLS, "auto", True, True, False)
    with pytest.raises(APIError, match="grammar backend"):
        plan_tools(hermes, "none", TOOLS, "required", True, None, False)
    generic = plan_tools(_agents("generic"), "outlines", TOOLS, "auto", True, None, False)
    assert generic.constraint is not None and generic.constraint[0] == "json_schema"
    none = plan_tools(hermes, "xgrammar", TOOLS, "none", True, None, True)  # grammar is fine
    assert none.constraint is None and none.template_tools() is None


def test_tool_choice_none_on_the_generic_format_drops_the_prompt() -> None:
    plan = plan_tools(_agents("generic"), "xgrammar", TOOLS, "none", True, None, False)
    history = [{"role": "system", "content": "Be brief."},
               {"role": "user", "content": "Weather?"},
               {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {
                   "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    messages = plan.messages(history)
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert "get_weather" in messages[2]["content"] and "sunny" in messages[3]["content"]


def test_reasoning_then_tools() -> None:
    from radixlm.reasoning import get_reasoning_parser

    plan = plan_tools(_agents("hermes"), "xgrammar", TOOLS, "auto", True, None, False)
    text = ('<think>Paris, so call it.</think>\n<tool_call>\n{"name": "get_weather", '
            '"arguments": {"city": "Paris"}}\n</tool_call>')
    whole = ChoiceParser(plan, get_reasoning_parser("qwen3")).parse_whole(text)
    assert whole.reasoning == "Paris, so call it." and whole.content == ""
    assert [c["function"]["arguments"] for c in whole.tool_calls] == ['{"city": "Paris"}']
    for cut in range(1, len(text)):
        stream = ChoiceParser(plan, get_reasoning_parser("qwen3"))
        stream.feed(text[:cut])
        stream.feed(text[cut:], final=True)
        assert stream.result.reasoning == whole.reasoning
        assert stream.result.content == ""
        assert [c["function"] for c in stream.result.tool_calls] == [
            c["function"] for c in whole.tool_calls]


def test_choice_regex_is_exact() -> None:
    choices = ["a.b", "(x|y)", "c*", "new\nline", "slash/\\"]
    pattern = choice_regex(choices, "choice")
    for c in choices:
        assert re.fullmatch(pattern, c)
    assert not re.fullmatch(pattern, "aXb") and not re.fullmatch(pattern, "x")


def test_peer_grammars() -> None:
    so = StructuredOutputs.model_validate({"json": {"type": "object"}})
    assert peer_grammars(so, {}, None) == [("json_schema", '{"type": "object"}')]
    kind, text = peer_grammars(None, {"guided_json": {"type": "object", "properties": {
        "a": {"type": "integer"}}}, "guided_whitespace_pattern": "[ ]?"}, None)[0]
    assert kind == "regex" and "[ ]?" in text
    assert peer_grammars(None, {}, 'root ::= "a"') == [("ebnf", 'root ::= "a"')]
    with pytest.raises(ValueError, match="not supported"):
        peer_grammars(StructuredOutputs(disable_any_whitespace=True), {}, None)


def test_responses_translation() -> None:
    req = ResponsesRequest.model_validate({
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"},
                                               {"type": "input_image", "image_url": "data:x"}]},
                  {"type": "function_call", "call_id": "c1", "name": "get_weather",
                   "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "c1", "output": "sunny"}],
        "instructions": "Be brief.", "max_output_tokens": 9,
        "tools": [{"type": "function", "name": "get_weather", "parameters": {
            "type": "object"}}], "tool_choice": {"type": "function", "name": "get_weather"},
        "text": {"format": {"type": "json_object"}}})
    chat = to_chat_request(req)
    assert [m.role for m in chat.messages] == ["system", "user", "assistant", "tool"]
    assert chat.max_tokens == 9 and chat.tools is not None
    assert chat.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert chat.response_format is not None and chat.response_format.type == "json_object"
    history = [{"role": "user", "content": "before"}, {"role": "assistant", "content": "ok"}]
    chat = to_chat_request(req, history)  # a previous response's conversation, then input
    assert [m.role for m in chat.messages] == ["system", "user", "assistant", "user",
                                               "assistant", "tool"]
    for bad in ({"tools": [{"type": "web_search"}]}, {"text": {"format": {"type": "xml"}}},
                {"input": []}):
        with pytest.raises(APIError):
            to_chat_request(ResponsesRequest.model_validate({"input": "hi", **bad}))
