"""Tool parsers: the registry, render as parse's inverse, request validation, detection."""

from __future__ import annotations

import json

import pytest
from _tool_texts import TOOLS

from radixlm.function_call import (
    TOOL_PARSERS,
    ParseResult,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolError,
    ToolSpec,
    detect_tool_parser,
    generic_messages,
    generic_tool_prompt,
    get_tool_parser,
    parse_tools,
)

PARSERS = ["hermes", "llama3", "mistral", "pythonic", "generic"]
CALLS = [
    ToolCall("get_weather", '{"location": "Zürich \\"HB\\"", "unit": "celsius"}'),
    ToolCall("search", '{"query": "a\\\\b 🍵", "filters": {"n": [1, -2.5, null, true], "o": {}}}'),
    ToolCall("get_time", "{}"),
]


def test_only_the_generic_format_is_constrained_under_auto_by_default() -> None:
    assert [n for n in PARSERS if get_tool_parser(n).constrain_auto] == ["generic"]


def test_registry_has_sglang_names() -> None:
    assert {"hermes", "qwen25", "qwen", "llama3", "mistral", "pythonic", "generic"} <= set(TOOL_PARSERS)
    assert type(get_tool_parser("qwen25")) is type(get_tool_parser("hermes"))
    with pytest.raises(ValueError, match="Unknown tool-call parser 'nope'"):
        get_tool_parser("nope")


@pytest.mark.parametrize("name", PARSERS)
@pytest.mark.parametrize("num_calls", [1, 3])
@pytest.mark.parametrize("content", ["", "Let me see."])
def test_render_is_the_inverse_of_parse(name: str, num_calls: int, content: str) -> None:
    parser = get_tool_parser(name, TOOLS)
    calls = CALLS[:num_calls]
    text = parser.render(content, calls)
    parsed = parser.parse(text)
    assert parsed.content == content
    assert [c.name for c in parsed.tool_calls] == [c.name for c in calls]
    for got, want in zip(parsed.tool_calls, calls):
        assert json.loads(got.arguments) == json.loads(want.arguments)
    if name != "pythonic":  # pythonic arguments are re-encoded from Python literals
        assert parsed.tool_calls == calls


@pytest.mark.parametrize("name", PARSERS)
def test_render_content_only(name: str) -> None:
    parser = get_tool_parser(name, TOOLS)
    assert parser.parse(parser.render("Just text.", [])) == ParseResult("Just text.", [])


def test_a_repeated_start_tag_is_content_and_the_call_after_it_counts() -> None:
    parser = get_tool_parser("hermes", TOOLS)
    text = '<tool_call><tool_call>{"name": "get_time"}</tool_call>'
    assert parser.parse(text) == ParseResult("<tool_call>", [ToolCall("get_time", "{}")])


def test_call_names_outside_the_tools_are_content() -> None:
    parser = get_tool_parser("pythonic", [ToolSpec("a")])
    assert parser.parse("[b(x=1)]") == ParseResult("[b(x=1)]", [])
    assert parser.parse("[a(x=1)]") == ParseResult("", [ToolCall("a", '{"x": 1}')])


def test_pythonic_reads_json_literals_and_rejects_non_json_values() -> None:
    parser = get_tool_parser("pythonic")
    assert parser.parse("[f(a=true, b=null, c=+3, d=-0.5)]").tool_calls == [
        ToolCall("f", '{"a": true, "b": null, "c": 3, "d": -0.5}')
    ]
    for text in ["[f(a=1j)]", "[f(a=b'x')]", "[f(a={1, 2})]", "[f(a=float('nan'))]", "[f(a={1: 2})]"]:
        assert parser.parse(text) == ParseResult(text, []), text


def test_delta_openai_shape() -> None:
    assert ToolCallDelta(0, "call_1", "f", "").to_openai() == {
        "index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}
    }
    assert ToolCallDelta(2, None, None, '{"a"').to_openai() == {
        "index": 2, "function": {"arguments": '{"a"'}
    }


# -- request validation ----------------------------------------------------------------------


def tool(name: object = "f", parameters: object = None, **function: object) -> dict[str, object]:
    spec: dict[str, object] = {"name": name, **function}
    if parameters is not None:
        spec["parameters"] = parameters
    return {"type": "function", "function": spec}


def test_parse_tools_accepts_openai_tools() -> None:
    specs = parse_tools([tool("get_weather", {"type": "object", "properties": {}}, description="d"),
                         tool("now")])
    assert [s.name for s in specs] == ["get_weather", "now"]
    assert specs[0].description == "d"
    assert specs[1].parameters == {"type": "object", "properties": {}}


@pytest.mark.parametrize(
    "tools, message",
    [
        ("x", "tools must be a list"),
        ([{"type": "retrieval"}], r"tools\[0\].type must be 'function'"),
        ([{"type": "function"}], r"tools\[0\].function must be an object"),
        ([tool(name=None)], r"tools\[0\].function.name is required"),
        ([tool(name="has space")], "must be 1-64 characters"),
        ([tool(name="x" * 65)], "must be 1-64 characters"),
        ([tool(parameters={"type": "string"})], "must describe an object"),
        ([tool(parameters={"type": "object", "properties": {"a": {"type": "nope"}}})],
         "Tool 0 function has invalid 'parameters' schema: "),  # SGLang's words
        ([tool(parameters=[1])], "must be a JSON schema object"),
        ([tool("a"), tool("a")], "more than one function named 'a'"),
    ],
)
def test_parse_tools_rejects_bad_tools(tools: object, message: str) -> None:
    with pytest.raises(ToolError, match=message):
        parse_tools(tools)


def test_tool_choice_validation() -> None:
    specs = [ToolSpec("a"), ToolSpec("b")]
    assert ToolChoice.from_openai(None, specs) == ToolChoice("auto")
    assert ToolChoice.from_openai("none", specs).allowed_tools(specs) == []
    assert ToolChoice.from_openai("required", specs) == ToolChoice("required")
    named = ToolChoice.from_openai({"type": "function", "function": {"name": "b"}}, specs)
    assert named == ToolChoice("named", "b") and named.allowed_tools(specs) == [specs[1]]
    with pytest.raises(ToolError, match="Tool 'c' not found in tools list."):  # SGLang's
        ToolChoice.from_openai({"type": "function", "function": {"name": "c"}}, specs)
    with pytest.raises(ToolError, match="tool_choice object must be"):
        ToolChoice.from_openai({"type": "function"}, specs)
    with pytest.raises(ToolError, match="Tools cannot be empty if tool choice is set to"):
        ToolChoice.from_openai("required", [])
    with pytest.raises(ToolError, match="must be 'none', 'auto', 'required'"):
        ToolChoice.from_openai("always", specs)


# -- choosing a parser -----------------------------------------------------------------------

QWEN25_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}{%- for tool in tools %}"
    "{{- tool | tojson }}{%- endfor %}{{- '</tools>\\nFor each function call, return a json "
    "object within <tool_call></tool_call> XML tags' }}{%- endif %}"
)
LLAMA31_TEMPLATE = (
    "{%- if tools is not none %}Respond in the format {\"name\": function name, \"parameters\": "
    "dictionary of argument name and its value}.{%- endif %}{{- '<|python_tag|>' }}"
)
LLAMA4_TEMPLATE = "{%- if tools %}[func_name1(params_name1=params_value1)]<|python_start|>{% endif %}"
MISTRAL_TEMPLATE = "{%- if tools %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]"
CHATML_NO_TOOLS = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}"


@pytest.mark.parametrize(
    "template, special_tokens, architectures, expected",
    [
        (QWEN25_TEMPLATE, (), (), "hermes"),
        (LLAMA31_TEMPLATE, (), (), "llama3"),
        (LLAMA4_TEMPLATE, (), (), "pythonic"),
        (MISTRAL_TEMPLATE, (), (), "mistral"),
        (CHATML_NO_TOOLS, ("<tool_call>",), ("Qwen2ForCausalLM",), "generic"),
        (None, (), (), "generic"),
        ("{% if tools %}{{ tools }}{% endif %}", ("[TOOL_CALLS]",), (), "mistral"),
        ("{% if tools %}{{ tools }}{% endif %}", (), ("Qwen2ForCausalLM",), "hermes"),
        ("{% if tools %}{{ tools }}{% endif %}", (), ("LlamaForCausalLM",), "generic"),
    ],
)
def test_detect_tool_parser(
    template: str | None, special_tokens: tuple[str, ...], architectures: tuple[str, ...],
    expected: str,
) -> None:
    choice = detect_tool_parser(template, special_tokens=special_tokens, architectures=architectures)
    assert choice.name == expected and choice.reason


def test_default_model_template_gets_the_generic_parser() -> None:
    import transformers

    from radixlm.model_loader.model_path import resolve_model_dir

    tokenizer = transformers.AutoTokenizer.from_pretrained(resolve_model_dir(None))
    template = tokenizer.chat_template
    special = set(tokenizer.all_special_tokens) | set(tokenizer.get_added_vocab())
    assert detect_tool_parser(template, special_tokens=special).name == "generic"


# -- the generic prompt ----------------------------------------------------------------------


def test_generic_prompt_lists_tools_and_the_answer_forms() -> None:
    prompt = generic_tool_prompt(TOOLS, ToolChoice("auto"))
    assert '"name": "get_weather"' in prompt and "The current weather in a place" in prompt
    assert '{"tool_calls": [' in prompt and '{"content": "<your answer>"}' in prompt
    required = generic_tool_prompt(TOOLS, ToolChoice("required"), parallel_tool_calls=False)
    assert "exactly one call" in required and '"content"' not in required
    named = generic_tool_prompt(TOOLS, ToolChoice("named", "get_time"))
    assert "Call the function get_time" in named and "get_weather" not in named


def test_generic_messages_rewrites_tool_turns_for_a_template_without_tools() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"location": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C, sunny"},
        {"role": "user", "content": "And in °F?"},
    ]
    out = generic_messages(messages, TOOLS, ToolChoice("auto"))
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.\n\nYou can call these functions")
    assert get_tool_parser("generic", TOOLS).parse(out[2]["content"]).tool_calls == [
        ToolCall("get_weather", '{"location": "Paris"}')
    ]
    result, question = out[3]["content"].split("\n\n")
    assert json.loads(result.removeprefix("Tool result: ")) == {
        "tool_call_id": "call_1", "name": "get_weather", "content": "21 C, sunny"
    }
    assert question == "And in °F?"
    assert messages[0]["content"] == "Be brief."  # the input is not changed
    no_system = generic_messages(messages[1:2], TOOLS, ToolChoice("auto"))
    assert no_system[0]["role"] == "system" and no_system[1] == messages[1]
