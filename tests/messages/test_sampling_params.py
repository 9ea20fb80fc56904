"""SamplingParams: the grammar fields (regex, json_schema, ebnf, structural_tag) and
their validation."""

from __future__ import annotations

import json
from typing import Any

import pytest

from radixlm.messages.sampling_params import (
    GRAMMAR_BACKEND_KINDS,
    GRAMMAR_PARAMS,
    TOO_MANY_GRAMMARS,
    SamplingParams,
)

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
TAG = {"structures": [{"begin": "<f>", "schema": SCHEMA, "end": "</f>"}], "triggers": ["<f"]}
TEXTS = {"regex": "[a-z]+", "json_schema": json.dumps(SCHEMA), "ebnf": 'root ::= "a"',
         "structural_tag": json.dumps(TAG)}


def test_no_grammar_by_default_and_backend_none_serves_it() -> None:
    params = SamplingParams.from_dict({})
    assert params.grammar is None
    params.verify_grammar("none")


@pytest.mark.parametrize("kind", GRAMMAR_PARAMS)
def test_grammar_is_kind_and_text(kind: str) -> None:
    params = SamplingParams.from_dict({kind: TEXTS[kind]})
    params.verify(vocab_size=100)
    assert params.grammar == (kind, TEXTS[kind])


@pytest.mark.parametrize("kind,obj", [("json_schema", SCHEMA), ("structural_tag", TAG)])
def test_an_object_is_dumped_to_json_text(kind: str, obj: dict[str, Any]) -> None:
    params = SamplingParams.from_dict({kind: obj})
    text = getattr(params, kind)
    assert isinstance(text, str) and json.loads(text) == obj


@pytest.mark.parametrize("first,second", [("regex", "json_schema"), ("json_schema", "ebnf"),
                                          ("ebnf", "structural_tag"), ("regex", "ebnf")])
def test_two_grammars_are_rejected(first: str, second: str) -> None:
    params = SamplingParams.from_dict({first: TEXTS[first], second: TEXTS[second]})
    with pytest.raises(ValueError, match=f"^{TOO_MANY_GRAMMARS}$"):
        params.verify(vocab_size=100)


@pytest.mark.parametrize("kind,value", [("regex", 5), ("ebnf", ["a"]), ("json_schema", 1.5),
                                        ("structural_tag", True), ("json_schema", ["x"])])
def test_non_string_grammar_is_rejected(kind: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"{kind} must be a string"):
        SamplingParams.from_dict({kind: value})


@pytest.mark.parametrize("kind", GRAMMAR_PARAMS)
def test_backend_none_rejects_every_grammar(kind: str) -> None:
    params = SamplingParams.from_dict({kind: TEXTS[kind]})
    with pytest.raises(ValueError, match="--grammar-backend none"):
        params.verify_grammar("none")


@pytest.mark.parametrize("kind", ["ebnf", "structural_tag"])
def test_outlines_rejects_what_it_cannot_compile(kind: str) -> None:
    params = SamplingParams.from_dict({kind: TEXTS[kind]})
    with pytest.raises(ValueError, match=f"outlines grammar backend does not support {kind}"):
        params.verify_grammar("outlines")


@pytest.mark.parametrize("backend", [b for b in GRAMMAR_BACKEND_KINDS if b != "none"])
def test_backends_accept_their_kinds(backend: str) -> None:
    for kind in GRAMMAR_BACKEND_KINDS[backend]:
        SamplingParams.from_dict({kind: TEXTS[kind]}).verify_grammar(backend)


def test_sample_seeds_wrap_to_64_bits() -> None:
    import torch

    from radixlm.messages.sampling_params import SEED_MAX, SEED_MIN, sample_seed

    assert sample_seed(None, 3) is None
    assert sample_seed(5, 2) == 7
    for seed in (SEED_MIN, -1, SEED_MAX):
        for i in (0, 127):
            value = sample_seed(seed, i)
            assert value is not None
            torch.Generator().manual_seed(value)  # fits: no OverflowError
    assert sample_seed(-1, 0) != sample_seed(-1, 1)


@pytest.mark.parametrize("raw,words", [
    ({"seed": 2**63}, "64-bit"), ({"seed": -(2**63) - 1}, "64-bit"),
    ({"temperature": float("inf")}, "finite"), ({"top_p": float("nan")}, "finite"),
    ({"temperature": 101.0}, "temperature"), ({"repetition_penalty": 1e-300}, "repetition"),
    ({"logit_bias": [1, 2]}, "object"), ({"logit_bias": {"x": 1}}, "token ids"),
    ({"logit_bias": {"1": float("inf")}}, "finite"), ({"logit_bias": {"1": "2"}}, "finite"),
    ({"ignore_eos": "yes"}, "true or false"), ({"n": True}, "integer"),
    ({"max_new_tokens": 2.0}, "integer"),
])
def test_bad_values_are_named(raw: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        SamplingParams.from_dict(raw).verify(vocab_size=100)


def test_logit_bias_keys_may_be_digit_strings_or_ints() -> None:
    params = SamplingParams.from_dict({"logit_bias": {"5": 1, 7: -2.5}})
    assert params.logit_bias == {5: 1.0, 7: -2.5}
