from __future__ import annotations

import random

from radixlm.detokenizer.stop_strings import (
    find_stop_string,
    partial_stop_len,
    safe_stream_len,
    trim_at_stop,
)


def test_find_stop_string_earliest_occurrence() -> None:
    assert find_stop_string("abc STOP def END", ["END", "STOP"]) == "STOP"
    assert find_stop_string("abc", ["x", "yz"]) is None
    assert find_stop_string("", ["x"]) is None
    assert find_stop_string("xab", ["ab", "xa"]) == "xa"
    assert find_stop_string("xab", ["xab", "xa"]) == "xa"  # same start: the shorter one
    assert find_stop_string("anything", []) is None


def test_partial_stop_len() -> None:
    assert partial_stop_len("hello wor", ["world"]) == 3
    assert partial_stop_len("hello world", ["world"]) == 0  # complete, not a proper prefix
    assert partial_stop_len("xx<|", ["<|im_end|>", "<"]) == 2
    assert partial_stop_len("", ["abc"]) == 0


def test_trim_at_stop_cuts_at_first_occurrence() -> None:
    assert trim_at_stop("one END two END", "END") == "one "
    assert trim_at_stop("no stop here", "END") == "no stop here"
    assert trim_at_stop("END", "END") == ""


def test_holdback_never_streams_any_part_of_a_stop_string() -> None:
    rng = random.Random(0)
    for _ in range(2000):
        stops = [
            "".join(rng.choice("ab") for _ in range(rng.randrange(1, 5)))
            for _ in range(rng.randrange(1, 3))
        ]
        full = "".join(rng.choice("abc") for _ in range(rng.randrange(0, 20)))
        first = min((p for s in stops if (p := full.find(s)) >= 0), default=len(full))
        text, streamed = "", 0
        while len(text) < len(full):
            text = full[: len(text) + rng.randrange(1, 4)]
            safe = safe_stream_len(text, stops)
            assert safe >= streamed  # streaming only ever moves forward
            streamed = safe
            assert streamed <= first  # never into the first stop string
            assert not any(s in text[:streamed] for s in stops)
        # at the end, a text without stop strings is released in full
        if first == len(full):
            assert streamed + partial_stop_len(full, stops) == len(full)


def test_safe_stream_len_stops_before_a_complete_stop_string() -> None:
    assert safe_stream_len("abc STOP and more", ["STOP"]) == 4
    assert safe_stream_len("abc ST", ["STOP"]) == 4
    assert safe_stream_len("abc", ["STOP"]) == 3
