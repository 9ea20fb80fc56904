"""Stop regexes: the scheduler's finding, the detokenizer's hold-back and trim.

The stream tests drive the DetokenizerManager with a tokenizer whose tokens
are characters, so a piece of text arrives in as many steps as wanted: the
output is cut at every character boundary of the match (and before and after
it), and no cut may ever show text of the match or past it.
"""

from __future__ import annotations

from typing import Any

import pytest

from radixlm.detokenizer.detokenizer_manager import DetokenizerManager
from radixlm.messages.io_struct import BatchTokenIDOut, FinishReason, TokenOut
from radixlm.messages.stop_regex import (
    check_stop_regexes,
    find_first_regex,
    max_match_len,
    safe_regex_stream_len,
    tail_tokens_needed,
    trim_at_regex,
)


class CharTokenizer:
    """Token id = code point: every character is one token."""

    eos_token_id = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)

    def batch_decode(self, sequences: list[list[int]], skip_special_tokens: bool = True,
                     **kwargs: Any) -> list[str]:
        return [self.decode(s) for s in sequences]


def _stream(text: str, cuts: list[int], patterns: list[str], finish: FinishReason,
            no_stop_trim: bool = False) -> list[str]:
    """Send `text` in pieces ending at `cuts` (the last one finishing); the text deltas."""
    manager = DetokenizerManager(CharTokenizer())
    deltas, start = [], 0
    for i, end in enumerate(cuts):
        last = i == len(cuts) - 1
        out = TokenOut("r", [ord(c) for c in text[start:end]], finish if last else None,
                       prompt_tokens=1, completion_tokens=end, cached_tokens=0,
                       stop_regex=patterns, no_stop_trim=no_stop_trim)
        deltas.append(manager.handle(BatchTokenIDOut([out])).outs[0].text_delta)
        start = end
    return deltas


@pytest.mark.parametrize("pattern,text,match", [
    (r"\d+;", "The answer is 42; then more", "42;"),
    (r"ANSWER: (yes|no)\.", "So ANSWER: no. and the rest", "ANSWER: no."),
    (r"\n\n", "line one\n\nline two", "\n\n"),
    (r"[A-Z]{3}!", "ab CDE! x", "CDE!"),
])
def test_stream_split_at_every_boundary_never_shows_the_match(pattern: str, text: str,
                                                               match: str) -> None:
    start = text.index(match)
    end = start + len(match)
    finish = FinishReason("stop", matched=pattern, matched_regex=True)
    for no_stop_trim in (False, True):
        want = text[:end] if no_stop_trim else text[:start]
        # The scheduler stops at the token that completes the match: the text the
        # detokenizer sees ends there, plus a few characters of that last token.
        for overshoot in (0, 1, 3):
            seen = text[: min(end + overshoot, len(text))]
            for cut in range(0, len(seen)):  # one split at every boundary
                cuts = [c for c in (cut, len(seen)) if c > 0]
                deltas = _stream(seen, cuts, [pattern], finish, no_stop_trim)
                assert "".join(deltas) == want, (cut, deltas)
                assert len(deltas[0]) <= start or len(deltas) == 1
            # Character by character: nothing of the match shows before the finish.
            deltas = _stream(seen, list(range(1, len(seen) + 1)), [pattern], finish,
                             no_stop_trim)
            assert "".join(deltas[:-1]) == text[:start][: len("".join(deltas[:-1]))]
            assert len("".join(deltas[:-1])) <= start
            assert "".join(deltas) == want


def test_text_without_a_match_is_released_in_full_at_the_end() -> None:
    text = "count: 12 and 13"
    deltas = _stream(text, list(range(1, len(text) + 1)), [r"\d+;"], FinishReason("length"))
    streamed = "".join(deltas[:-1])
    assert streamed == "count: 12 and "  # the trailing "13" could still become "13;"
    assert "".join(deltas) == text


def test_partial_match_holds_back_from_where_it_could_begin() -> None:
    assert safe_regex_stream_len("hello wor", ["world"]) == 6
    assert safe_regex_stream_len("hello wxr", ["world"]) == 9
    assert safe_regex_stream_len("abc 12", [r"\d+;"]) == 4
    assert safe_regex_stream_len("abc 12;", [r"\d+;", "c 1"]) == 2  # the earliest match
    assert safe_regex_stream_len("abc 12", [r"\d+;"], pos=5) == 5  # never moves back


def test_find_and_trim() -> None:
    m = find_first_regex("a 1; b 22;", [r"\d+;", "b"])
    assert m is not None and (m.start, m.end, m.pattern) == (2, 4, r"\d+;")
    assert find_first_regex("nothing", [r"\d"]) is None
    assert trim_at_regex("x 12; y", r"\d+;", keep_match=False) == "x "
    assert trim_at_regex("x 12; y", r"\d+;", keep_match=True) == "x 12;"
    assert trim_at_regex("no match", r"\d", keep_match=False) == "no match"


def test_match_length_bounds_the_scheduler_window() -> None:
    assert max_match_len("abc") == 3
    assert max_match_len("a|bcd") == 3
    assert max_match_len("[0-9]{2,5};") == 6
    assert max_match_len(r"(?=x)ab$") == 2
    assert max_match_len(r"\d+") is None
    assert tail_tokens_needed(["abc", r"x\d+"]) == 256 + 3
    assert tail_tokens_needed(["ab"]) == 5


@pytest.mark.parametrize("patterns,message", [
    (["("], "not a valid regex"),
    (["a*"], "matches the empty string"),
    (["x" * 300], "256-byte limit"),
    (["a"] * 33, "At most 32"),
])
def test_bad_patterns_are_refused(patterns: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_stop_regexes(patterns)
