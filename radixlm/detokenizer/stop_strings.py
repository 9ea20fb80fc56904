"""Stop strings: finding them (scheduler) and never streaming them (detokenizer).

While a request runs, its confirmed text is streamed only up to the first
complete stop string and, short of one, up to the longest suffix that could
still grow into a stop string (a proper prefix of one): a stop string is never
streamed, not even in part. At finish on a stop string, the output is cut
before its first occurrence (unless the request set `no_stop_trim`).
"""

from __future__ import annotations

from typing import NamedTuple


class StopMatch(NamedTuple):
    start: int  # index of the stop string in the text
    stop: str


def find_first_stop(text: str, stops: list[str]) -> StopMatch | None:
    """The stop string that starts earliest in text (the shortest on a tie), or None."""
    best: StopMatch | None = None
    for stop in stops:
        start = text.find(stop) if stop else -1
        if start >= 0 and (best is None or (start, len(stop)) < (best.start, len(best.stop))):
            best = StopMatch(start, stop)
    return best


def find_stop_string(tail_text: str, stops: list[str]) -> str | None:
    """For the scheduler: the stop string that occurs earliest in `tail_text`, or None.

    `tail_text` is the decoded tail of the output; it must reach back at least
    the longest stop string's length before the newest token's text.
    """
    match = find_first_stop(tail_text, stops)
    return match.stop if match is not None else None


def partial_stop_len(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
    held = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), held, -1):
            if stop.startswith(text[len(text) - k :]):
                held = k
                break
    return held


def safe_stream_len(text: str, stops: list[str]) -> int:
    """How much of the confirmed `text` can be streamed while the request runs.

    All of it but a tail that may start a stop string, and never past the
    first complete stop string (should the scheduler not have stopped on it).
    """
    safe = len(text) - partial_stop_len(text, stops)
    match = find_first_stop(text, stops)
    return safe if match is None else min(safe, match.start)


def trim_at_stop(text: str, stop: str) -> str:
    """`text` cut before the first occurrence of `stop` (unchanged if absent)."""
    pos = text.find(stop) if stop else -1
    return text if pos < 0 else text[:pos]
