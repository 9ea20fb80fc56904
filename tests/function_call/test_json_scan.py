"""The incremental JSON scanner agrees with json.loads; the string decoder with json.loads."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.function_call.call_object import ArgumentsReader
from radixlm.function_call.json_scan import (
    MAX_DEPTH,
    JsonScanner,
    JsonStringDecoder,
    Step,
    loads_strict,
)

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
)
DUMP_OPTIONS = st.fixed_dictionaries(
    {"ensure_ascii": st.booleans(), "indent": st.none() | st.integers(0, 2),
     "separators": st.sampled_from([None, (",", ":"), (", ", ": ")])}
)


def scan(text: str) -> tuple[bool, int]:
    """(the scanner accepts the whole text as one value, characters consumed)."""
    scanner = JsonScanner()
    for i, ch in enumerate(text):
        step = scanner.push(ch)
        if step is Step.FAIL:
            return False, i
        if step is Step.DONE_BEFORE:
            return text[i:].strip() == "", i
        if step is Step.DONE:
            return text[i + 1 :].strip() == "" and scanner.depth == 0, i + 1
    return scanner.can_end(), len(text)


def loads_ok(text: str) -> bool:
    try:
        loads_strict(text)
    except ValueError:
        return False
    return True


@settings(max_examples=150, deadline=None)
@given(JSON_VALUES, DUMP_OPTIONS)
def test_scanner_accepts_every_dumped_value_and_ends_where_it_ends(value: Any, options: dict) -> None:
    text = json.dumps(value, **options)
    ok, consumed = scan(text)
    assert ok
    if not isinstance(value, int | float) or isinstance(value, bool):
        assert consumed == len(text)  # ends exactly at its last character


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES, st.integers(0, 1000), st.sampled_from(list('{}[],:"\\ 0-eE.tfnu\x01')),
       st.sampled_from(["insert", "delete", "replace"]))
def test_scanner_verdict_equals_json_loads_on_mutated_text(
    value: Any, position: int, ch: str, how: str
) -> None:
    text = json.dumps(value)
    i = position % (len(text) + 1)
    if how == "insert":
        text = text[:i] + ch + text[i:]
    elif how == "delete":
        text = text[:i] + text[i + 1 :]
    else:
        text = text[:i] + ch + text[i + 1 :]
    assert scan(text)[0] == loads_ok(text.strip() or "x"), text


def test_scanner_rejects_what_strict_json_rejects() -> None:
    for text in ["NaN", "-Infinity", "01", "1.", ".5", "1e", '"\x01"', '"\\x"', "[1,]", '{"a" 1}',
                 "{'a': 1}", "tru", "[1 2]", '{"a":1,}', '"\\u12g4"', "--1"]:
        assert not scan(text)[0], text
    assert not scan("[" * (MAX_DEPTH + 1))[0]


def test_failed_push_leaves_the_scanner_unchanged() -> None:
    scanner = JsonScanner()
    for ch in "[1":
        scanner.push(ch)
    assert scanner.push("x") is Step.FAIL
    assert scanner.push(",") is Step.MORE and scanner.push("2") is Step.MORE
    assert scanner.push("]") is Step.DONE


@settings(max_examples=150, deadline=None)
@given(st.text(), st.booleans())
def test_string_decoder_equals_json_loads(value: str, ensure_ascii: bool) -> None:
    encoded = json.dumps(value, ensure_ascii=ensure_ascii)
    decoder = JsonStringDecoder()
    decoded = "".join(decoder.push(ch) for ch in encoded[1:])
    assert decoder.closed and decoded == value


def test_string_decoder_keeps_a_lone_surrogate_and_rejects_bad_escapes() -> None:
    decoder = JsonStringDecoder()
    assert "".join(decoder.push(c) for c in '\\ud83dx"') == json.loads('"\\ud83dx"')
    bad = JsonStringDecoder()
    bad.push("\\")
    try:
        bad.push("q")
    except ValueError:
        pass
    else:
        raise AssertionError("\\q accepted")


def test_arguments_reader_escapes_raw_control_characters() -> None:
    reader = ArgumentsReader()
    steps = [reader.push(ch) for ch in '  {"code": "a\n\tb\x07"}']
    assert steps[-1] is Step.DONE and Step.FAIL not in steps
    assert reader.text == '{"code": "a\\n\\tb\\u0007"}'
    assert json.loads(reader.text) == {"code": "a\n\tb\x07"}
    assert ArgumentsReader().push("[") is Step.FAIL  # arguments are an object
