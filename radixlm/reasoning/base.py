"""Reasoning parsers: split a reasoning model's output into its think block and the answer.

`parse(text) -> ReasoningResult(reasoning_content, content)`; `stream()` gives a
`ReasoningStream` fed text pieces, returning `ReasoningDelta`s whose joined
parts equal `parse` for every cut of the text. The tags never reach either part
(a possible tag prefix is held back until decided); whitespace just inside the
block and at the start of the answer is dropped.

The block either opens with `start_tag` at the start of the output, or is
already open when the prompt ended with it (`starts_in_reasoning`: DeepSeek-R1's
template always does; Qwen3's "thinking" variants do). Without an end tag the
whole output was reasoning (it was cut off while thinking). With
`thinking=False` (`enable_thinking: false`) there is no block: all is content.

NOTE for grammars: a constraint applies to the content, so it starts after
`end_tag` (or at once when thinking is off).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import ClassVar, NamedTuple

from radixlm.utils import resolve_lazy

_WHITESPACE = " \t\n\r"


class ReasoningResult(NamedTuple):
    reasoning_content: str
    content: str


class ReasoningDelta(NamedTuple):
    reasoning_content: str
    content: str


class _Phase(enum.Enum):
    START = "start"  # nothing decided: whitespace, then maybe the start tag
    REASONING = "reasoning"
    CONTENT = "content"


class ReasoningStream:
    """The streaming side of a ReasoningParser (one per request and choice)."""

    def __init__(self, start_tag: str, end_tag: str, *, starts_in_reasoning: bool,
                 thinking: bool) -> None:
        self._start_tag, self._end_tag = start_tag, end_tag
        self._starts_in_reasoning = starts_in_reasoning
        self._phase = _Phase.START if thinking else _Phase.CONTENT
        self._held = ""  # START: what was read; REASONING: whitespace + a possible end tag prefix
        self._reasoning_started = False
        self._content_started = not thinking  # passthrough keeps leading whitespace
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._out = ["", ""]

    def feed(self, text: str) -> ReasoningDelta:
        for ch in text:
            self._push(ch)
        return self._take()

    def finish(self) -> ReasoningDelta:
        if self._phase is _Phase.START:
            if self._starts_in_reasoning:
                self._emit_reasoning(self._held.strip(_WHITESPACE))
            else:
                self._content_started = True  # no block: verbatim
                self._emit_content(self._held)
        elif self._phase is _Phase.REASONING:
            # Cut off while thinking: a held end-tag prefix was reasoning text.
            self._emit_reasoning(self._held.rstrip(_WHITESPACE))
        self._held = ""
        return self._take()

    def result(self) -> ReasoningResult:
        return ReasoningResult("".join(self._reasoning), "".join(self._content))

    def _push(self, ch: str) -> None:
        if self._phase is _Phase.CONTENT:
            self._emit_content(ch)
        elif self._phase is _Phase.REASONING:
            self._push_reasoning(ch)
        else:
            self._push_start(ch)

    def _push_start(self, ch: str) -> None:
        held = self._held + ch
        stripped = held.lstrip(_WHITESPACE)
        if not stripped:
            self._held = held
            return
        if self._start_tag.startswith(stripped):
            self._held = held
            if stripped == self._start_tag:
                self._phase, self._held = _Phase.REASONING, ""
            return
        # No start tag: the block was open already, or there is none.
        self._held = ""
        if self._starts_in_reasoning:
            self._phase = _Phase.REASONING
            for c in stripped:
                self._push_reasoning(c)
        else:
            self._phase, self._content_started = _Phase.CONTENT, True  # no block: verbatim
            self._emit_content(held)

    def _push_reasoning(self, ch: str) -> None:
        held = self._held + ch
        if held.endswith(self._end_tag):
            self._emit_reasoning(held[: -len(self._end_tag)].rstrip(_WHITESPACE))
            self._held, self._phase = "", _Phase.CONTENT
            return
        # Hold back the longest suffix that is whitespace then a possible end-tag prefix.
        keep = next(
            (i for i in range(len(held)) if self._end_tag.startswith(held[i:].lstrip(_WHITESPACE))),
            len(held),
        )
        if keep:
            self._emit_reasoning(held[:keep])
        self._held = held[keep:]

    def _emit_reasoning(self, text: str) -> None:
        if not self._reasoning_started:
            text = text.lstrip(_WHITESPACE)
        if text:
            self._reasoning_started = True
            self._reasoning.append(text)
            self._out[0] += text

    def _emit_content(self, text: str) -> None:
        if not self._content_started:
            text = text.lstrip(_WHITESPACE)
        if text:
            self._content_started = True
            self._content.append(text)
            self._out[1] += text

    def _take(self) -> ReasoningDelta:
        delta = ReasoningDelta(self._out[0], self._out[1])
        self._out = ["", ""]
        return delta


class ReasoningParser:
    """One model family's think block (see the module doc).

    starts_in_reasoning: None takes the family's default. thinking: False means the
    request turned thinking off (no block; all content).
    """

    name: ClassVar[str] = "base"
    start_tag: ClassVar[str] = "<think>"
    end_tag: ClassVar[str] = "</think>"
    default_starts_in_reasoning: ClassVar[bool] = False

    def __init__(self, *, starts_in_reasoning: bool | None = None, thinking: bool = True) -> None:
        self.starts_in_reasoning = (
            self.default_starts_in_reasoning if starts_in_reasoning is None else starts_in_reasoning
        )
        self.thinking = thinking

    def stream(self) -> ReasoningStream:
        return ReasoningStream(
            self.start_tag, self.end_tag, starts_in_reasoning=self.starts_in_reasoning,
            thinking=self.thinking,
        )

    def parse(self, text: str) -> ReasoningResult:
        stream = self.stream()
        stream.feed(text)
        stream.finish()
        return stream.result()

    @classmethod
    def prompt_opens_reasoning(cls, prompt: str) -> bool:
        """Whether a rendered prompt ends inside an open think block (its template wrote
        the start tag), so the output starts in reasoning."""
        stripped = prompt.rstrip(_WHITESPACE)
        return stripped.endswith(cls.start_tag)


REASONING_PARSERS: dict[str, str | type[ReasoningParser]] = {
    "deepseek-r1": "radixlm.reasoning.deepseek_r1:DeepSeekR1Parser",
    "qwen3": "radixlm.reasoning.qwen3:Qwen3Parser",
    "qwen3-thinking": "radixlm.reasoning.qwen3:Qwen3ThinkingParser",
}


def get_reasoning_parser(
    name: str, *, starts_in_reasoning: bool | None = None, thinking: bool = True
) -> ReasoningParser:
    """The parser registered as `name` (SGLang's --reasoning-parser names)."""
    if name not in REASONING_PARSERS:
        raise ValueError(
            f"Unknown reasoning parser {name!r}; expected one of {sorted(REASONING_PARSERS)}"
        )
    cls: Callable[..., ReasoningParser] = resolve_lazy(REASONING_PARSERS[name])
    return cls(starts_in_reasoning=starts_in_reasoning, thinking=thinking)
