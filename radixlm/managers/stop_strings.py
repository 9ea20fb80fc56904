"""Stop strings: finding them (scheduler) and never streaming them (detokenizer)."""

from __future__ import annotations


def find_stop_string(tail_text: str, stops: list[str]) -> str | None:
    """The stop string that occurs earliest in `tail_text`, or None."""
    best: tuple[int, str] | None = None
    for stop in stops:
        pos = tail_text.find(stop)
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, stop)
    return best[1] if best else None


def safe_stream_len(text: str, stops: list[str]) -> int:
    """How much of `text` can be streamed: all but a tail that may start a stop string."""
    held = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), held, -1):
            if stop.startswith(text[len(text) - k :]):
                held = k
                break
    return len(text) - held


def trim_at_stop(text: str, stop: str) -> str:
    """`text` cut before the first occurrence of `stop` (unchanged if absent)."""
    pos = text.find(stop)
    return text if pos < 0 else text[:pos]
