"""SamplingParams: the grammar fields (regex, json_schema, ebnf, structural_tag) and
their validation."""

from __future__ import annotations

import json
from typing import Any

import pytest

from radixlm.sampling.sampling_params import (
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
