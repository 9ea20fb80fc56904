"""Reasoning parsers on recorded outputs: parse, and streaming at every cut, agree; tags never
leak into either part."""

from __future__ import annotations

import itertools
import random

import pytest

from radixlm.reasoning import (
    REASONING_PARSERS,
    ReasoningParser,
    ReasoningResult,
    get_reasoning_parser,
)

R1_ANSWER = "The answer is **4**.\n\nBecause 2 + 2 = 4."
CASES: list[tuple[str, dict[str, bool], str, str, str]] = [
    # (parser, options, text, reasoning_content, content)
    ("deepseek-r1", {}, "Okay, the user asks 2+2.\nThat is 4 </thin k>.\n</think>\n\n" + R1_ANSWER,
     "Okay, the user asks 2+2.\nThat is 4 </thin k>.", R1_ANSWER),
    ("deepseek-r1", {}, "<think>\nLet me think: 東京 <b>bold</b>\n</think>Answer: 🍣",
     "Let me think: 東京 <b>bold</b>", "Answer: 🍣"),
    ("deepseek-r1", {}, "Still thinking when the tokens ran out <", "Still thinking when the tokens ran out <", ""),
    ("deepseek-r1", {}, "</think>Direct answer.", "", "Direct answer."),
    ("deepseek-r1", {}, "", "", ""),
    ("qwen3", {}, "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?",
     "The user greets me.", "Hello! How can I help?"),
    ("qwen3", {}, "<think>\n\n</think>\n\nHi.", "", "Hi."),
    ("qwen3", {}, "  No think block at all: <think> here is text.",
     "", "  No think block at all: <think> here is text."),
    ("qwen3", {}, "<thin", "", "<thin"),
    ("qwen3", {}, "<think>never closed", "never closed", ""),
    ("qwen3", {"thinking": False}, "<think>kept</think> as content", "", "<think>kept</think> as content"),
    ("qwen3", {"starts_in_reasoning": True}, "opened by the template</think>ok", "opened by the template", "ok"),
    ("qwen3-thinking", {}, "step 1, step 2\n</think>\n\nDone", "step 1, step 2", "Done"),
]
IDS = [f"{c[0]}-{i}" for i, c in enumerate(CASES)]


def stream_all(parser: ReasoningParser, pieces: list[str]) -> ReasoningResult:
    stream = parser.stream()
    reasoning, content = "", ""
    for piece in [*pieces, None]:
        delta = stream.finish() if piece is None else stream.feed(piece)
        reasoning += delta.reasoning_content
        content += delta.content
    assert stream.result() == (reasoning, content)
    return ReasoningResult(reasoning, content)


def cuts(text: str) -> list[list[str]]:
    pieces = [list(text)] + [[text[:k], text[k:]] for k in range(len(text) + 1)]
    rng = random.Random(len(text))
    for _ in range(5):
        points = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, 5)))
        pieces.append([text[a:b] for a, b in itertools.pairwise([0, *points, len(text)])])
    return pieces


@pytest.mark.parametrize("name, options, text, reasoning, content", CASES, ids=IDS)
def test_parse_and_stream_at_every_cut(
    name: str, options: dict[str, bool], text: str, reasoning: str, content: str
) -> None:
    parser = get_reasoning_parser(name, **options)
    assert parser.parse(text) == (reasoning, content)
    for pieces in cuts(text):
        assert stream_all(parser, pieces) == (reasoning, content), pieces


def test_deltas_never_show_a_tag() -> None:
    parser = get_reasoning_parser("qwen3")
    stream = parser.stream()
    seen = []
    for ch in "<think>a </think>b":
        seen.append(stream.feed(ch))
    seen.append(stream.finish())
    assert all("<" not in d.reasoning_content and "<" not in d.content for d in seen)
    # the reasoning shows as soon as it is certain: "a" before the end tag is complete
    texts = [d.reasoning_content for d in seen]
    assert texts.index("a") < len("<think>a </think")


def test_registry_and_defaults() -> None:
    assert {"deepseek-r1", "qwen3"} <= set(REASONING_PARSERS)
    assert get_reasoning_parser("deepseek-r1").starts_in_reasoning
    assert not get_reasoning_parser("qwen3").starts_in_reasoning
    assert get_reasoning_parser("qwen3", starts_in_reasoning=True).starts_in_reasoning
    with pytest.raises(ValueError, match="Unknown reasoning parser 'o1'"):
        get_reasoning_parser("o1")


def test_prompt_opens_reasoning() -> None:
    parser = get_reasoning_parser("qwen3")
    assert parser.prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not parser.prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not parser.prompt_opens_reasoning("<|im_start|>assistant\n")
