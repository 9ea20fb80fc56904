"""Stop regexes (SGLang's `stop_regex`): finding them (scheduler) and never streaming them.

A request may stop where one of its regexes first matches its output. They
behave as stop strings do (stop_strings.py): the scheduler searches the
decoded tail of the output after every token; at finish the text is cut
before the match (through its end with `no_stop_trim`), and nothing past the
match is ever shown; while the request runs, the detokenizer streams its text
only up to where a match could still begin. "Could still begin" is a partial
match reaching the end of the text, which the `regex` package finds
(`partial=True`; the stdlib `re` cannot), so `regex` does all the matching
here, on both sides, with the same semantics.
"""

from __future__ import annotations

import functools
import re._parser as sre_parse  # the stdlib's own regex parser (for the match-length bound)
from typing import Any, NamedTuple

import regex

MAX_STOP_REGEX_LEN = 256  # bytes per pattern (SGLang's limit)
MAX_STOP_REGEX_COUNT = 32  # patterns per request (SGLang's limit)
# Tokens of output tail the scheduler decodes for a pattern without a length bound
# (`\d+;`): a longer match is not found (SGLang decodes the whole output instead).
MAX_TAIL_TOKENS = 256
# Seconds one search may take (a pathological pattern must not stall the scheduler):
# past it the scheduler ends the request, the detokenizer holds its text back.
MATCH_TIMEOUT = 0.1
_UNBOUNDED = int(sre_parse.MAXREPEAT)


class RegexMatch(NamedTuple):
    start: int
    end: int
    pattern: str


@functools.lru_cache(maxsize=1024)
def compile_stop_regex(pattern: str) -> Any:
    """The compiled pattern (cached: every step of a request searches with it)."""
    return regex.compile(pattern)


def check_stop_regexes(patterns: list[str]) -> None:
    """Raise ValueError (naming the problem) for patterns a request may not use."""
    if len(patterns) > MAX_STOP_REGEX_COUNT:
        raise ValueError(f"At most {MAX_STOP_REGEX_COUNT} stop_regex patterns are allowed, "
                         f"got {len(patterns)}")
    for pattern in patterns:
        if len(pattern.encode()) > MAX_STOP_REGEX_LEN:
            raise ValueError(f"stop_regex {pattern[:40]!r}... is over the "
                             f"{MAX_STOP_REGEX_LEN}-byte limit")
        try:
            compiled = compile_stop_regex(pattern)
        except (regex.error, RecursionError, OverflowError) as e:
            raise ValueError(f"stop_regex {pattern!r} is not a valid regex: {e}") from None
        if compiled.fullmatch("") is not None:
            raise ValueError(f"stop_regex {pattern!r} matches the empty string")


def max_match_len(pattern: str) -> int | None:
    """An upper bound on the characters a match of `pattern` spans; None: unbounded."""
    try:
        bound = _max_len(sre_parse.parse(pattern))
    except Exception:  # noqa: BLE001 - a construct the stdlib parser lacks: no bound
        return None
    return None if bound >= _UNBOUNDED else bound


def _max_len(subpattern: Any) -> int:
    total = 0
    for op, value in subpattern:
        if op in (sre_parse.LITERAL, sre_parse.NOT_LITERAL, sre_parse.IN, sre_parse.ANY):
            total += 1
        elif op == sre_parse.SUBPATTERN:
            total += _max_len(value[3])
        elif op == sre_parse.BRANCH:
            total += max((_max_len(b) for b in value[1]), default=0)
        elif op in (sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT, sre_parse.POSSESSIVE_REPEAT):
            _, high, inner = value
            if high == _UNBOUNDED:
                return _UNBOUNDED
            total += high * _max_len(inner)
        elif op == sre_parse.ATOMIC_GROUP:
            total += _max_len(value)
        elif op == sre_parse.GROUPREF_EXISTS:
            total += max(_max_len(value[1]), _max_len(value[2]) if value[2] else 0)
        elif op == sre_parse.GROUPREF:
            return _UNBOUNDED  # a back-reference: as long as its group, be safe
        # AT (anchors), ASSERT / ASSERT_NOT (lookarounds) consume nothing.
        if total >= _UNBOUNDED:
            return _UNBOUNDED
    return total


def tail_tokens_needed(patterns: list[str]) -> int:
    """Output tokens the scheduler decodes to see any match that ends in the newest one
    (a character is at most a token; a few more for merges at the window's start)."""
    bounds = [max_match_len(p) for p in patterns]
    longest = max((MAX_TAIL_TOKENS if b is None else b for b in bounds), default=0)
    return min(longest, MAX_TAIL_TOKENS) + 3


def find_first_regex(text: str, patterns: list[str], pos: int = 0) -> RegexMatch | None:
    """The match that starts earliest in `text[pos:]` (the shortest on a tie), or None.
    Raises TimeoutError past MATCH_TIMEOUT."""
    best: RegexMatch | None = None
    for pattern in patterns:
        m = compile_stop_regex(pattern).search(text, pos, timeout=MATCH_TIMEOUT)
        if m is not None and (best is None or (m.start(), m.end()) < (best.start, best.end)):
            best = RegexMatch(m.start(), m.end(), pattern)
    return best


def safe_regex_stream_len(text: str, patterns: list[str], pos: int = 0) -> int:
    """How much of the confirmed `text` may be streamed while the request runs: up to
    the first match, and short of one, up to where a partial match at the end begins.

    `pos`: the length already streamed (no match can start before it, so the search
    starts there and a step costs what is new, not the whole text).
    """
    safe = len(text)
    for pattern in patterns:
        try:
            m = compile_stop_regex(pattern).search(text, pos, partial=True,
                                                   timeout=MATCH_TIMEOUT)
        except TimeoutError:
            return pos  # hold it all back; the scheduler ends the request
        if m is not None:
            safe = min(safe, m.start())
    return max(safe, pos)


def trim_at_regex(text: str, pattern: str, keep_match: bool) -> str:
    """`text` cut before the first match of `pattern` (after it with keep_match);
    unchanged if there is none."""
    try:
        m = compile_stop_regex(pattern).search(text, timeout=MATCH_TIMEOUT)
    except TimeoutError:
        return text
    if m is None:
        return text
    return text[: m.end()] if keep_match else text[: m.start()]
