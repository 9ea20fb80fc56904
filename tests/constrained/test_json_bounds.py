"""Bounded numbers in JSON-schema grammars (issue 32, fault 5), on every backend.

The fault: `{name: string, population: integer}` let a model write digits until
max_new_tokens (`"population": 3152222222…`). Here a greedy "digit-loving" model
(it picks a digit whenever the grammar allows one) must still end the number and
the object; without the bound (`json_bounded_numbers=False`) it never does.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import jsonschema
import pytest

from radixlm.constrained import (
    BaseGrammarBackend,
    BaseGrammarObject,
    GrammarError,
    allocate_vocab_mask,
    create_grammar_backend,
)
from radixlm.constrained.base_grammar_backend import mask_to_bool
from radixlm.constrained.json_bounds import (
    INT64_MAX,
    INT64_MIN,
    NUMBER_REGEX,
    bound_schema,
    int64_regex,
)

CITY = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                         "population": {"type": "integer"}},
        "required": ["name", "population"], "additionalProperties": False}
MEASURE = {"type": "object", "properties": {"value": {"type": "number"}},
           "required": ["value"], "additionalProperties": False}


def test_int64_regex_is_exactly_int64() -> None:
    pattern = re.compile(int64_regex())
    rng = random.Random(0)
    samples = [0, 1, -1, 9, 10, INT64_MAX, INT64_MIN, INT64_MAX + 1, INT64_MIN - 1, 10**18,
               -(10**18), 10**19, 9223372036854775799, 9223372036854775817]
    samples += [rng.randint(-2**64, 2**64) >> rng.randint(0, 64) for _ in range(5000)]
    for x in samples:
        assert bool(pattern.fullmatch(str(x))) == (INT64_MIN <= x <= INT64_MAX), x
    for text in ["-0", "01", "", "-", "1.0"]:
        assert not pattern.fullmatch(text)


def test_number_regex_bounds_each_part() -> None:
    pattern = re.compile(NUMBER_REGEX)
    for good in ["0", "-1.5", "1234567890123456789", "0.1234567890", "6.02e23", "1E-300"]:
        assert pattern.fullmatch(good), good
    for bad in ["12345678901234567890", "0.12345678901", "1e1000", "01", "1.", "-"]:
        assert not pattern.fullmatch(bad), bad


def test_schema_bounds_stay_the_schemas_own() -> None:
    schema = {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": 0},
        "b": {"type": "integer", "minimum": 0, "maximum": 10**30},
        "c": {"type": ["number", "null"], "exclusiveMaximum": 5},
        "d": {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/N"}]}},
        "$defs": {"N": {"type": "number"}}}
    out = bound_schema(schema, "xgrammar")
    props = out["properties"]
    assert props["a"] == {"type": "integer", "minimum": 0, "maximum": INT64_MAX}
    assert props["b"]["maximum"] == 10**30  # the schema says more: kept
    assert props["c"] == {"type": ["number", "null"], "exclusiveMaximum": 5,
                          "minimum": -(10**16)}
    assert props["d"]["anyOf"][0] == {"type": "integer"}  # xgrammar's own rule is bounded
    ll = bound_schema(schema, "llguidance")
    assert ll["properties"]["d"]["anyOf"][0]["maximum"] == INT64_MAX
    assert ll["$defs"]["N"]["multipleOf"] == 1e-10
    assert ll["additionalProperties"] == {"$ref": "#/$defs/radixlm_any"}
    assert schema["properties"]["a"] == {"type": "integer", "minimum": 0}  # not mutated


def _digit_ids(tokenizer: Any, vocab_size: int) -> list[int]:
    """Digit tokens, the most digits and the highest first ("9" before "0")."""
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    ids = [i for i, t in enumerate(texts) if t and all("0" <= c <= "9" for c in t)]
    return sorted(ids, key=lambda i: (-len(texts[i]), texts[i][0] == "0", -int(texts[i])))


def _greedy_digits(grammar: BaseGrammarObject, backend: BaseGrammarBackend,
                   digits: list[int], first: str, max_steps: int = 80) -> str | None:
    """Feed `first`, then always a digit token where one is allowed, else the lowest
    allowed token; the text once the grammar ends, None if it never ends."""
    for token in backend.tokenizer.encode(first, add_special_tokens=False):
        grammar.accept_token(token)
    mask = allocate_vocab_mask(1, backend.vocab_size)
    out: list[int] = []
    for _ in range(max_steps):
        if grammar.is_terminated():
            return str(backend.tokenizer.decode(
                [t for t in out if t not in backend.eos_token_ids]))
        grammar.fill_vocab_mask(mask, 0)
        allowed = mask_to_bool(mask[0], backend.vocab_size).nonzero().flatten().tolist()
        allowed_set = set(allowed)
        choice = next((t for t in digits if t in allowed_set), None)
        if choice is None:  # prefer ending: EOS, else a closing token
            choice = next((t for t in allowed if t in backend.eos_token_ids), allowed[0])
        grammar.accept_token(choice)
        out.append(choice)
    return None


@pytest.mark.parametrize("name", ["xgrammar", "outlines", "llguidance"])
def test_an_unbounded_integer_ends_and_stays_json(name: str, backends: dict[str, Any],
                                                  tokenizer: Any, vocab_size: int) -> None:
    backend = backends[name]
    digits = _digit_ids(tokenizer, vocab_size)
    start = '{"name":"Paris","population":' if name == "outlines" else \
        '{"name": "Paris", "population": '
    text = _greedy_digits(backend.compile("json_schema", json.dumps(CITY)), backend, digits,
                          start)
    assert text is not None, "the integer never ended"
    value = json.loads(start + text)
    jsonschema.validate(value, CITY)
    if name == "outlines":  # 19 digits (json_bounds.py: exact int64 costs it too much)
        assert abs(value["population"]) < 10**19
    else:
        assert INT64_MIN <= value["population"] <= INT64_MAX
    assert value["population"] > 10**17  # the digit-loving model wrote as many as it could


@pytest.mark.parametrize("name", ["xgrammar", "outlines", "llguidance"])
def test_numbers_and_any_values_are_bounded(name: str, backends: dict[str, Any],
                                            tokenizer: Any, eos_token_ids: list[int]) -> None:
    backend = backends[name]
    separators = (",", ":") if name == "outlines" else (", ", ": ")

    def accepts(schema: Any, value: Any) -> bool:
        text = value if isinstance(value, str) else json.dumps(value, separators=separators)
        grammar = backend.compile("json_schema", json.dumps(schema))
        try:
            for token in tokenizer.encode(text, add_special_tokens=False):
                grammar.accept_token(token)
            grammar.accept_token(eos_token_ids[0])
        except GrammarError:
            return False
        return True

    sep = separators[1]
    assert accepts(MEASURE, {"value": 1234.5678})
    assert not accepts(MEASURE, f'{{"value"{sep}1.{"1" * 30}}}')
    assert not accepts(MEASURE, f'{{"value"{sep}{"9" * 30}}}')
    assert accepts(CITY, {"name": "P", "population": INT64_MAX})
    assert accepts(CITY, {"name": "P", "population": -(2**62)})
    assert not accepts(CITY, {"name": "P", "population": 10**19})
    if name == "outlines":
        return  # a value of any type takes outlines-core seconds to index
    assert not accepts(CITY, {"name": "P", "population": INT64_MAX + 1})
    # json_object: a value of any type inside (a number cannot run on either).
    assert accepts({"type": "object"}, {"a": 12, "b": [1.5, {"c": None}]})
    assert not accepts({"type": "object"}, f'{{"a"{sep}{"1" * 40}}}')


def test_the_flag_turns_the_bound_off(tokenizer: Any, vocab_size: int,
                                      eos_token_ids: list[int]) -> None:
    digits = _digit_ids(tokenizer, vocab_size)
    for name in ["xgrammar", "outlines", "llguidance"]:
        backend = create_grammar_backend(name, tokenizer, vocab_size, eos_token_ids,
                                         json_bounded_numbers=False)
        start = '{"name":"Paris","population":' if name == "outlines" else \
            '{"name": "Paris", "population": '
        grammar = backend.compile("json_schema", json.dumps(CITY))
        assert _greedy_digits(grammar, backend, digits, start, max_steps=40) is None, name
