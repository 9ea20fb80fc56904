"""Streaming tool-call parsing: every cut of every text gives the same deltas as parse().

For each recorded text: fed one character at a time, cut in two at every
character boundary, and cut at random; the joined deltas equal the
non-streamed parse (for malformed text: each other), the delta shapes are
OpenAI's (one entry per call, carrying its id, name and whole arguments), and
no content delta shows a format's markup. A text cut off (max_tokens) keeps its
complete calls and never shows the cut one, streamed or not.
"""

from __future__ import annotations

import itertools
import json
import random

import pytest
from _tool_texts import BROKEN_LATE, MALFORMED, MARKUP, TOOLS, VALID

from radixlm.function_call import (
    ContentDelta,
    ParseResult,
    StreamDelta,
    ToolCall,
    ToolCallDelta,
    ToolParser,
    get_tool_parser,
)


def run_stream(parser: ToolParser, pieces: list[str], cut: bool = False
               ) -> tuple[ParseResult, list[StreamDelta]]:
    ids = (f"call_{i}" for i in itertools.count())
    stream = parser.stream(id_factory=lambda: next(ids))
    deltas: list[StreamDelta] = []
    for piece in pieces:
        deltas += stream.feed(piece)
    deltas += stream.finish(cut=cut)
    return joined(deltas), deltas


def joined(deltas: list[StreamDelta]) -> ParseResult:
    """What a client rebuilds from the deltas, checking their shape on the way."""
    content = ""
    calls: list[list[str]] = []
    ids: set[str] = set()
    for delta in deltas:
        if isinstance(delta, ContentDelta):
            assert delta.text, "empty content delta"
            content += delta.text
            continue
        assert isinstance(delta, ToolCallDelta)
        # One delta per call, once complete: id, name and arguments that parse.
        assert delta.id is not None and delta.name
        assert delta.index == len(calls), "calls come in index order"
        assert delta.id not in ids
        ids.add(delta.id)
        assert isinstance(json.loads(delta.arguments), dict)
        calls.append([delta.name, delta.arguments])
        assert delta.to_openai()["type"] == "function"
    return ParseResult(content, [ToolCall(n, a) for n, a in calls])


def cuts(text: str) -> list[list[str]]:
    """One character at a time, two pieces at every boundary, and random pieces."""
    pieces = [list(text)]
    pieces += [[text[:k], text[k:]] for k in range(len(text) + 1)]
    rng = random.Random(len(text))
    for _ in range(5):
        points = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, 6)))
        pieces.append([text[a:b] for a, b in itertools.pairwise([0, *points, len(text)])])
    return pieces


@pytest.mark.parametrize("name, text, content, calls", VALID, ids=[f"{v[0]}-{i}" for i, v in enumerate(VALID)])
def test_valid_text_streams_as_parsed_at_every_cut(
    name: str, text: str, content: str, calls: list[tuple[str, str]]
) -> None:
    parser = get_tool_parser(name, TOOLS)
    expected = ParseResult(content, [ToolCall(*c) for c in calls])
    assert parser.parse(text) == expected
    for call in expected.tool_calls:
        assert isinstance(json.loads(call.arguments), dict)
    for pieces in cuts(text):
        result, deltas = run_stream(parser, pieces)
        assert result == expected, pieces
        for marker in MARKUP[name]:
            assert all(marker not in d.text for d in deltas if isinstance(d, ContentDelta))


@pytest.mark.parametrize("name, text", MALFORMED, ids=[f"{m[0]}-{i}" for i, m in enumerate(MALFORMED)])
def test_malformed_text_never_raises_and_streams_the_same_at_every_cut(name: str, text: str) -> None:
    parser = get_tool_parser(name, TOOLS)
    parsed = parser.parse(text)
    assert parsed == ParseResult(text, [])  # content, exactly as written
    first, _ = run_stream(parser, list(text))
    if text not in BROKEN_LATE:
        assert first == parsed  # it failed before anything of it was streamed
    for pieces in cuts(text)[1:]:
        assert run_stream(parser, pieces)[0] == first, pieces


def test_late_break_never_shows_the_broken_call() -> None:
    parser = get_tool_parser("hermes", TOOLS)
    text = '<tool_call>\n{"name": "get_time", "arguments": {"timezone": }}\n</tool_call> ok'
    assert parser.parse(text) == ParseResult(text, [])
    streamed, _ = run_stream(parser, list(text))
    assert streamed == ParseResult(text, [])  # nothing of it was shown: all content


def test_a_call_is_one_delta_once_complete() -> None:
    parser = get_tool_parser("hermes", TOOLS)
    stream = parser.stream(id_factory=lambda: "call_1")
    assert stream.feed('<tool_call>\n{"name": "get_weather", "arguments": {"loc') == []
    second = stream.feed('ation": "Paris"}}\n</tool')
    assert second == [ToolCallDelta(0, "call_1", "get_weather", '{"location": "Paris"}')]
    assert second[0].to_openai() == {"index": 0, "id": "call_1", "type": "function",
                                     "function": {"name": "get_weather",
                                                  "arguments": '{"location": "Paris"}'}}
    assert stream.feed("_call>") == [] and stream.finish() == []


# Texts cut off by max_tokens, the complete calls they keep and the content.
CUT = [
    ("hermes", '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n'
     '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Par', "", ["get_time"]),
    ("hermes", 'Let me see. <tool_call>\n{"name": "get_wea', "Let me see.", []),
    ("hermes", "Let me see. <tool_c", "Let me see.", []),
    ("generic", '{"tool_calls": [{"name": "get_time", "arguments": {}}, {"name": "search", '
     '"arguments": {"query": "Paris', "", ["get_time"]),
    ("generic", '{"tool_calls": [{"name": "get_ti', "", []),
    ("generic", '{"content": "Paris is sun', "Paris is sun", []),
    ("llama3", '{"name": "get_time", "parameters": {}}; {"name": "search", "parameters": {"q',
     "", ["get_time"]),
    ("mistral", '[TOOL_CALLS] [{"name": "get_time", "arguments": {}}, {"name": "sea', "",
     ["get_time"]),
    ("mistral", '[TOOL_CALLS]get_time[ARGS]{"timezone": "U', "", []),
    ("pythonic", '[get_time(), search(query="Par', "", ["get_time"]),
]


@pytest.mark.parametrize("name, text, content, calls", CUT,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CUT)])
def test_cut_text_keeps_complete_calls_and_drops_the_cut_one(
        name: str, text: str, content: str, calls: list[str]) -> None:
    parser = get_tool_parser(name, TOOLS)
    parsed = parser.parse(text, cut=True)
    assert parsed.content == content
    assert [c.name for c in parsed.tool_calls] == calls
    for pieces in cuts(text):
        streamed, deltas = run_stream(parser, pieces, cut=True)
        assert streamed == parsed, pieces
        for marker in MARKUP[name]:
            assert all(marker not in d.text for d in deltas if isinstance(d, ContentDelta))


def test_text_before_a_call_streams_as_content_at_once() -> None:
    stream = get_tool_parser("hermes", TOOLS).stream()
    assert stream.feed("Checking the weather") == [ContentDelta("Checking the weather")]
    assert stream.feed(" now <tool") == [ContentDelta(" now")]  # " <tool" may be markup
    assert stream.feed("box> x") == [ContentDelta(" <toolbox> x")]


def test_parser_without_tools_accepts_any_name() -> None:
    parser = get_tool_parser("hermes")
    assert parser.parse('<tool_call>{"name": "anything", "arguments": {}}</tool_call>') == (
        "",
        [ToolCall("anything", "{}")],
    )


def test_feed_after_finish_raises() -> None:
    stream = get_tool_parser("generic", TOOLS).stream()
    stream.finish()
    with pytest.raises(RuntimeError):
        stream.feed("x")
