"""Each backend, driven by a fake model that samples random allowed tokens from the mask."""

from __future__ import annotations

import copy
import json
import random
import re
from typing import Any

import jsonschema
import pytest
import torch

from radixlm.constrained import (
    BaseGrammarBackend,
    BaseGrammarObject,
    GrammarError,
    allocate_vocab_mask,
    apply_vocab_mask,
    create_grammar_backend,
)
from radixlm.constrained.base_grammar_backend import mask_to_bool

MAX_STEPS = 300
CLOSING_TEXTS = ['"', "}", "]", '"}', '"]']

REGEXES = [
    r"(Hello|Hi|Hey)",
    r"\d{3}",
    r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",
    r"user@example\.com",
    r"#[0-9a-fA-F]{6}",
]

CITY_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[\\w]+$"},
        "population": {"type": "integer"},
    },
    "required": ["name", "population"],
    "additionalProperties": False,
}

PROFILE_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer"},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "address", "tags", "active"],
    "additionalProperties": False,
}


def allowed_ids(grammar: BaseGrammarObject, vocab_size: int) -> list[int]:
    mask = allocate_vocab_mask(1, vocab_size)
    grammar.fill_vocab_mask(mask, 0)
    return mask_to_bool(mask[0], vocab_size).nonzero().flatten().tolist()


@pytest.fixture(scope="session")
def closing_ids(tokenizer: Any) -> set[int]:
    return {i for i in range(len(tokenizer)) if tokenizer.decode([i]) in CLOSING_TEXTS}


def drive(
    grammar: BaseGrammarObject,
    tokenizer: Any,
    vocab_size: int,
    eos_ids: list[int],
    seed: int,
    closing: set[int],
) -> str:
    """Sample random allowed tokens until the grammar terminates; return the decoded text.

    To finish in a few steps the fake model prefers, half the time, EOS or a token that
    closes a string / object / array when one is allowed.
    """
    rng = random.Random(seed)
    output: list[int] = []
    for _ in range(MAX_STEPS):
        if grammar.is_terminated():
            break
        allowed = allowed_ids(grammar, vocab_size)
        assert allowed, "the grammar allows no token before terminating"
        preferred = [t for t in allowed if t in eos_ids] or [t for t in allowed if t in closing]
        token = rng.choice(preferred if preferred and rng.random() < 0.5 else allowed)
        grammar.accept_token(token)
        output.append(token)
    assert grammar.is_terminated(), f"not terminated after {MAX_STEPS} steps"
    assert output[-1] in eos_ids or not set(output) & set(eos_ids)
    return tokenizer.decode([t for t in output if t not in eos_ids])


@pytest.mark.parametrize("regex", REGEXES)
def test_regex_outputs_match(
    backend: BaseGrammarBackend,
    regex: str,
    tokenizer: Any,
    vocab_size: int,
    eos_token_ids: list[int],
    closing_ids: set[int],
) -> None:
    compiled = backend.compile("regex", regex)
    for seed in range(3):
        text = drive(compiled.copy(), tokenizer, vocab_size, eos_token_ids, seed, closing_ids)
        assert re.fullmatch(regex, text), (backend.name, regex, text)


@pytest.mark.parametrize("schema", [CITY_SCHEMA, PROFILE_SCHEMA], ids=["city", "profile"])
def test_json_schema_outputs_validate(
    backend: BaseGrammarBackend,
    schema: dict[str, Any],
    tokenizer: Any,
    vocab_size: int,
    eos_token_ids: list[int],
    closing_ids: set[int],
) -> None:
    compiled = backend.compile("json_schema", json.dumps(schema))
    for seed in range(3):
        text = drive(compiled.copy(), tokenizer, vocab_size, eos_token_ids, seed, closing_ids)
        jsonschema.validate(json.loads(text), schema)
        outside_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
        assert not re.search(r"\s{3,}", outside_strings), f"unbounded whitespace: {text!r}"


@pytest.mark.parametrize(
    "ebnf, pattern",
    [
        ('root ::= "Hello" | "Hi" | "Hey"', r"(Hello|Hi|Hey)"),
        ('root ::= "[" num ("," num)* "]"\nnum ::= [1-9] [0-9]?', r"\[[1-9]\d?(,[1-9]\d?)*\]"),
    ],
)
def test_ebnf_outputs_match(
    backend: BaseGrammarBackend,
    ebnf: str,
    pattern: str,
    tokenizer: Any,
    vocab_size: int,
    eos_token_ids: list[int],
    closing_ids: set[int],
) -> None:
    if "ebnf" not in backend.supported_kinds:
        with pytest.raises(GrammarError, match="does not support ebnf"):
            backend.compile("ebnf", ebnf)
        return
    compiled = backend.compile("ebnf", ebnf)
    for seed in range(3):
        text = drive(compiled.copy(), tokenizer, vocab_size, eos_token_ids, seed, closing_ids)
        assert re.fullmatch(pattern, text), text


@pytest.mark.parametrize(
    "kind, text",
    [("regex", "(ab"), ("json_schema", "INVALID"), ("ebnf", "root ::= (")],
)
def test_invalid_grammar_raises(backend: BaseGrammarBackend, kind: str, text: str) -> None:
    expected = (
        f"Failed to compile {kind} grammar"
        if kind in backend.supported_kinds
        else "does not support"
    )
    with pytest.raises(GrammarError, match=expected) as e:
        backend.compile(kind, text)
    assert not re.search(r"\.(cc|cpp|h):\d+", str(e.value)), e.value  # no C++ source paths


def test_rejected_token_raises(
    backend: BaseGrammarBackend, tokenizer: Any, vocab_size: int
) -> None:
    grammar = backend.compile("regex", r"\d{3}")
    letter = tokenizer.encode("x", add_special_tokens=False)[0]
    with pytest.raises(GrammarError):
        grammar.accept_token(letter)
    digit = tokenizer.encode("1", add_special_tokens=False)[0]
    grammar.accept_token(digit)  # the state is unchanged by the rejection


def test_eos_only_where_the_grammar_may_end(
    backend: BaseGrammarBackend, tokenizer: Any, vocab_size: int, eos_token_ids: list[int]
) -> None:
    grammar = backend.compile("regex", r"\d{2}")
    for step in range(3):
        allowed = set(allowed_ids(grammar, vocab_size))
        assert bool(allowed & set(eos_token_ids)) == (step == 2)
        if step < 2:
            grammar.accept_token(tokenizer.encode("7", add_special_tokens=False)[0])
    grammar.accept_token(eos_token_ids[-1])
    assert grammar.is_terminated()


def test_rollback_then_reaccept_gives_same_mask(
    backend: BaseGrammarBackend, tokenizer: Any, vocab_size: int, eos_token_ids: list[int]
) -> None:
    grammar = backend.compile("json_schema", json.dumps(CITY_SCHEMA))
    rng = random.Random(0)
    masks, accepted = [], []
    for _ in range(6):
        allowed = allowed_ids(grammar, vocab_size)
        masks.append(allowed)
        token = rng.choice([t for t in allowed if t not in eos_token_ids])
        grammar.accept_token(token)
        accepted.append(token)
    grammar.rollback(4)
    assert allowed_ids(grammar, vocab_size) == masks[2]
    for token, mask in zip(accepted[2:], masks[2:]):
        assert allowed_ids(grammar, vocab_size) == mask
        grammar.accept_token(token)


@pytest.mark.parametrize("regex", [r"(Hello|Hi|Hey)", r"Hi[a-z]?"], ids=["ends", "may-go-on"])
def test_rollback_over_eos(
    backend: BaseGrammarBackend,
    regex: str,
    tokenizer: Any,
    vocab_size: int,
    eos_token_ids: list[int],
) -> None:
    grammar = backend.compile("regex", regex)
    for token in tokenizer.encode("Hi", add_special_tokens=False):
        grammar.accept_token(token)
    before = allowed_ids(grammar, vocab_size)
    grammar.accept_token(eos_token_ids[0])
    assert grammar.is_terminated()
    grammar.rollback(1)
    assert not grammar.is_terminated()
    assert allowed_ids(grammar, vocab_size) == before


def test_jump_forward_fixed_keys(backend: BaseGrammarBackend, tokenizer: Any) -> None:
    compact = copy.copy(backend)
    compact.json_disable_any_whitespace = True
    grammar = compact.compile("json_schema", json.dumps(CITY_SCHEMA))
    assert grammar.try_jump_forward() == '{"name":"'
    for token in tokenizer.encode('{"name":"Paris"', add_special_tokens=False):
        grammar.accept_token(token)
    assert grammar.try_jump_forward() == ',"population":'


def test_jump_forward_none_when_free(backend: BaseGrammarBackend) -> None:
    grammar = backend.compile("regex", r"[a-z]+")
    assert grammar.try_jump_forward() is None


def test_jump_forward_keeps_multibyte_characters(
    backend: BaseGrammarBackend, tokenizer: Any
) -> None:
    grammar = backend.compile("regex", "café (au lait|noir)")
    assert grammar.try_jump_forward() == "café "


def test_copy_is_independent(backend: BaseGrammarBackend, tokenizer: Any, vocab_size: int) -> None:
    grammar = backend.compile("regex", r"x\d")
    fresh = grammar.copy()
    grammar.accept_token(tokenizer.encode("x", add_special_tokens=False)[0])
    assert allowed_ids(fresh, vocab_size) != allowed_ids(grammar, vocab_size)


def test_apply_vocab_mask_batch(
    backend: BaseGrammarBackend, tokenizer: Any, vocab_size: int
) -> None:
    """Row 0 constrained, row 1 left all-ones: only row 0 gets -inf."""
    mask = allocate_vocab_mask(2, vocab_size)
    backend.compile("regex", r"(Hello|Hi|Hey)").fill_vocab_mask(mask, 0)
    logits = torch.zeros(2, vocab_size)
    apply_vocab_mask(logits, mask)
    finite = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    prefixes = [tokenizer.decode([t]) for t in finite]
    assert "Hi" in prefixes
    assert set(prefixes) <= {"H", "He", "Hel", "Hell", "Hello", "Hi", "Hey"}
    assert torch.isfinite(logits[1]).all()


def test_structural_tag(backends: dict[str, BaseGrammarBackend], tokenizer: Any) -> None:
    spec = {
        "type": "structural_tag",
        "structures": [
            {
                "begin": "<f=get>",
                "schema": {
                    "type": "object",
                    "properties": {"x": {"type": "integer"}},
                    "required": ["x"],
                },
                "end": "</f>",
            }
        ],
        "triggers": ["<f="],
    }
    for name in ("xgrammar", "llguidance"):
        grammar = backends[name].compile("structural_tag", json.dumps(spec))
        for token in tokenizer.encode('ok <f=get>{"x": 1}</f>', add_special_tokens=False):
            grammar.accept_token(token)
    with pytest.raises(GrammarError, match="does not support structural_tag"):
        backends["outlines"].compile("structural_tag", json.dumps(spec))


def test_unknown_backend(tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="Unknown grammar backend"):
        create_grammar_backend("nope", tokenizer, 10, [0])


@pytest.mark.parametrize("regex,expected", [
    (r"^user@example\.com$", r"user@example\.com"),
    (r"price \$", r"price \$"),  # an escaped dollar is a literal, not an anchor
    (r"a\\$", r"a\\"),  # an escaped backslash, then the anchor
    ("(a|b)", "(a|b)"),
])
def test_outlines_strips_anchors(regex: str, expected: str) -> None:
    from radixlm.constrained.outlines_backend import strip_anchors

    assert strip_anchors(regex) == expected
