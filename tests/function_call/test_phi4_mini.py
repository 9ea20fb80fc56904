"""Phi-4-mini's tool calls (`functools[...]`): parse, render, stream, detect, constrain, and
the tools written into the system message where its chat template reads them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_tool_constraints import TOOLS, accepts

from radixlm.entrypoints.openai.tools import system_message_tools
from radixlm.function_call import (
    ContentDelta,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    detect_tool_parser,
    get_tool_parser,
)

# Phi-4-mini-instruct's own template (tokenizer_config.json)
PHI4_MINI_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and "
    "message['tools'] is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + "
    "'<|tool|>' + message['tools'] + '<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + "
    "message['role'] + '|>' + message['content'] + '<|end|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}")
WEATHER = '{"location": "Paris", "unit": "celsius"}'


def test_parse_and_render() -> None:
    parser = get_tool_parser("phi4_mini", TOOLS)
    text = f'Sure. functools[{{"name": "get_weather", "arguments": {WEATHER}}}, ' \
           '{"name": "get_time", "arguments": {}}]'
    parsed = parser.parse(text)
    assert parsed.content == "Sure."  # whitespace before the calls is dropped
    assert parsed.tool_calls == [ToolCall("get_weather", WEATHER), ToolCall("get_time", "{}")]
    assert parser.parse(parser.render("Sure.", parsed.tool_calls)) == parsed


@pytest.mark.parametrize("text", [
    "I used functools in Python.",  # the marker in prose, not followed by "["
    'functools[{"name": "unknown", "arguments": {}}]',  # a tool the request lacks
    "functools[not json]",
])
def test_what_does_not_parse_is_content(text: str) -> None:
    parsed = get_tool_parser("phi4_mini", TOOLS).parse(text)
    assert parsed.tool_calls == [] and parsed.content == text


def test_streaming_at_every_cut_equals_parse() -> None:
    parser = get_tool_parser("phi4_mini", TOOLS)
    text = f'Ok functools[{{"name": "get_weather", "arguments": {WEATHER}}}]'
    whole = parser.parse(text)
    for cut in range(1, len(text)):
        stream = parser.stream()
        deltas = stream.feed(text[:cut]) + stream.feed(text[cut:]) + stream.finish()
        content = "".join(d.text for d in deltas if isinstance(d, ContentDelta))
        args = "".join(d.arguments for d in deltas if isinstance(d, ToolCallDelta))
        assert content == whole.content, cut
        assert json.loads(args) == json.loads(WEATHER), cut


def test_detected_from_phi4_mini_template() -> None:
    choice = detect_tool_parser(PHI4_MINI_TEMPLATE, architectures=["Phi3ForCausalLM"])
    assert choice.name == "phi4_mini"


def test_tools_go_into_the_system_message() -> None:
    specs = TOOLS[:1]
    with_system = system_message_tools([{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "Weather?"}], specs)
    assert with_system[0]["content"] == "Be brief."
    assert json.loads(with_system[0]["tools"])[0]["name"] == "get_weather"
    without = system_message_tools([{"role": "user", "content": "Weather?"}], specs)
    assert without[0]["role"] == "system" and "tools" in without[0] and len(without) == 2


def test_constraint_accepts_calls(backends: dict[str, Any], tokenizer: Any,
                                  eos_token_ids: list[int]) -> None:
    parser = get_tool_parser("phi4_mini", TOOLS)
    call = f'functools[{{"name": "get_weather", "arguments": {WEATHER}}}]'
    for mode in ("required", "auto"):
        grammar = backends["xgrammar"].compile(*parser.constraint(
            TOOLS, ToolChoice(mode), parallel_tool_calls=True, backend="xgrammar"))
        assert accepts(grammar, tokenizer, eos_token_ids[0], call), mode
        assert not accepts(grammar, tokenizer, eos_token_ids[0],
                           'functools[{"name": "get_weather", "arguments": {}}]'), mode
