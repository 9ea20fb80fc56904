"""Constrained decoding in the Engine on the default model: jump-forward on and off,
multi-byte forced text, retraction, logprobs and abort with grammars (xgrammar)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator

import jsonschema
import pytest

from radixlm import Engine

PROFILE_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "house": {"enum": ["Gryffindor", "Hufflepuff", "Ravenclaw", "Slytherin"]},
        "wand": {
            "type": "object",
            "properties": {"wood": {"type": "string", "maxLength": 16},
                           "length": {"enum": [9, 10, 11, 12, 13]}},
            "required": ["wood", "length"],
            "additionalProperties": False,
        },
        "friends": {"type": "array", "items": {"type": "string", "maxLength": 16},
                    "minItems": 1, "maxItems": 2},
        "alive": {"type": "boolean"},
    },
    "required": ["name", "house", "wand", "friends", "alive"],
    "additionalProperties": False,
}
PROMPTS = ["Give the profile of Harry Potter as JSON.", "Describe Luna Lovegood in JSON."]
JSON_PARAMS = {"json_schema": json.dumps(PROFILE_SCHEMA), "temperature": 0,
               "max_new_tokens": 160}
# Every character after the first choice is forced: a run of multi-byte text to jump over.
MULTIBYTE_REGEX = r"(Voilà|Grüße): café ☕ crème brûlée, 日本語 — naïve façade"


def _check_kv(engine: Engine) -> None:
    info = engine.get_server_info()
    assert info["kv_integrity"] == "ok"
    assert info["num_used_tokens"] == 0 and info["num_running_reqs"] == 0


@pytest.fixture(scope="module")
def jf_off() -> Iterator[Engine]:
    with Engine(max_total_tokens=4096, disable_jump_forward=True) as engine:
        yield engine
        _check_kv(engine)


@pytest.fixture(scope="module")
def jf_on() -> Iterator[Engine]:
    with Engine(max_total_tokens=4096) as engine:
        yield engine
        _check_kv(engine)


def test_jump_forward_takes_fewer_steps_and_stays_valid(jf_on: Engine, jf_off: Engine) -> None:
    on = jf_on.generate(PROMPTS, JSON_PARAMS)
    off = jf_off.generate(PROMPTS, JSON_PARAMS)
    for a, b in zip(on, off):
        for out in (a, b):
            assert out["meta_info"]["finish_reason"]["type"] == "stop", out["text"]
            jsonschema.validate(json.loads(out["text"]), PROFILE_SCHEMA)
        assert b["meta_info"]["jump_forward_tokens"] == 0
        assert b["meta_info"]["forward_steps"] == b["meta_info"]["completion_tokens"]
        assert a["meta_info"]["jump_forward_tokens"] > 10
        # Forced tokens are output tokens, computed several per forward pass.
        assert a["meta_info"]["forward_steps"] < 0.7 * b["meta_info"]["forward_steps"]
        assert a["meta_info"]["completion_tokens"] == len(a["output_ids"])
    _check_kv(jf_on)


@pytest.mark.parametrize("stream", [False, True])
def test_multibyte_forced_text_is_exact(jf_on: Engine, jf_off: Engine, stream: bool) -> None:
    params = {"regex": MULTIBYTE_REGEX, "temperature": 0, "max_new_tokens": 64}
    for engine in (jf_on, jf_off):
        if stream:
            chunks = list(engine.generate("Say something:", params, stream=True))
            text = "".join(c["delta"] for c in chunks)
            meta = chunks[-1]["meta_info"]
        else:
            out = engine.generate("Say something:", params)
            text, meta = out["text"], out["meta_info"]
        assert re.fullmatch(MULTIBYTE_REGEX, text), text
        assert meta["finish_reason"]["type"] == "stop"
        assert (meta["jump_forward_tokens"] > 5) == (engine is jf_on), meta
    _check_kv(jf_on)


def test_n_greater_than_1_and_logprobs_with_grammar(jf_on: Engine) -> None:
    outs = jf_on.generate("Pick a colour:", {"regex": "#[0-9a-f]{6}", "n": 4, "temperature": 1.0,
                                             "max_new_tokens": 12}, return_logprob=True,
                          top_logprobs_num=3)
    assert len(outs) == 4
    for out in outs:
        assert re.fullmatch("#[0-9a-f]{6}", out["text"]), out["text"]
        lps = out["meta_info"]["output_token_logprobs"]
        assert len(lps) == out["meta_info"]["completion_tokens"] == len(out["output_ids"])
        # Logprobs come from the masked distribution: every chosen token is finite.
        assert all(math.isfinite(lp[0]) for lp in lps)
        # No jump-forward for logprob requests: every token was sampled.
        assert out["meta_info"]["jump_forward_tokens"] == 0
    _check_kv(jf_on)


def test_min_new_tokens_yields_to_the_grammar(jf_on: Engine) -> None:
    # The grammar ends after 1-2 tokens; min_new_tokens must not ban the EOS it requires.
    out = jf_on.generate("Answer:", {"regex": "(yes|no)", "min_new_tokens": 8,
                                     "max_new_tokens": 16})
    assert out["text"] in ("yes", "no")
    assert out["meta_info"]["finish_reason"]["type"] == "stop"


def test_abort_constrained_stream(jf_on: Engine) -> None:
    params = {"regex": "[a-z ]{200}", "temperature": 1.0, "max_new_tokens": 200}
    stream = jf_on.generate("Letters:", params, stream=True, rid="grammar-abort")
    first = next(iter(stream))
    assert first["meta_info"]["finish_reason"] is None
    jf_on.abort("grammar-abort")
    last = list(stream)[-1]
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    _check_kv(jf_on)


def test_retraction_keeps_grammar_state() -> None:
    # A pool far too small for 6 concurrent JSON answers: requests get retracted
    # and resumed; their grammar state stays with their kept output tokens.
    with Engine(max_total_tokens=320, schedule_conservativeness=0.0) as engine:
        outs = engine.generate(PROMPTS * 3, JSON_PARAMS)
        info = engine.get_server_info()
        assert info["num_retractions"] > 0
        for out in outs:
            assert out["meta_info"]["finish_reason"]["type"] == "stop", out["text"]
            jsonschema.validate(json.loads(out["text"]), PROFILE_SCHEMA)
        _check_kv(engine)


def test_thinking_budget_closes_the_block_then_the_grammar_rules() -> None:
    """thinking_token_budget on the real model (deepseek-r1: the output starts inside the
    block): the end tag comes once the budget is spent, with or without a grammar of the
    request's own, which then rules the answer. Budget 0 answers at once."""
    with Engine(max_total_tokens=4096, reasoning_parser="deepseek-r1") as engine:
        free = engine.generate("Think about Paris.", {"thinking_token_budget": 6,
                                                      "max_new_tokens": 40, "temperature": 0})
        thought, _, answer = free["text"].partition("</think>")
        assert _ and len(engine.tokenizer.encode(thought)) <= 6 + 2, free["text"]
        digits = engine.generate("Think, then give a number.", {
            "thinking_token_budget": 4, "regex": "[0-9]{3}", "max_new_tokens": 40,
            "temperature": 0})
        thought, _, answer = digits["text"].partition("</think>")
        # (whitespace in the token that ended the tag is not the grammar's: reasoner_grammar)
        assert _ and re.fullmatch("[0-9]{3}", answer.strip()), digits["text"]
        now = engine.generate("Think, then give a number.", {
            "thinking_token_budget": 0, "regex": "[0-9]{3}", "max_new_tokens": 40,
            "temperature": 0})
        assert now["text"].startswith("</think>") or now["text"].lstrip().startswith("</"), now
        assert re.fullmatch("[0-9]{3}", now["text"].partition("</think>")[2].strip()), now
        _check_kv(engine)
