"""Speculative decoding (n-gram drafts) on the default model: greedy output equals
decoding without speculation, token for token.

Prompts that ask the model to repeat their input give drafts it accepts. One
Engine without speculation gives the references (float32, see conftest.py);
Engines with `--speculative-algorithm NGRAM` must match them one prompt at a
time, batched, without the radix cache, with prefill chunks of 16, with a KV
pool small enough to force retraction, under a JSON-schema constraint (with
jump-forward), with stop strings, n > 1, logprobs and streaming.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import pytest

from radixlm import Engine

PROMPTS = [
    "Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape.\nList:",
    "Copy the sentence: The quick brown fox jumps over the lazy dog near the river.\nCopy:",
    "Write the numbers one to twenty in words: one, two, three,",
    "Repeat after me: red green blue yellow orange purple pink brown black white.\n",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n# Again:\n",
]
GREEDY = {"temperature": 0.0, "max_new_tokens": 64, "ignore_eos": True}
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 30},
                   "city": {"type": "string", "maxLength": 30},
                   "tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                            "maxItems": 4}},
    "required": ["name", "city", "tags"],
    "additionalProperties": False,
}
JSON_PROMPT = ("Record: name Maria Lopez, city Buenos Aires, tags cooking, travel, chess.\n"
               "The same record as JSON:")
JSON_PARAMS = {"json_schema": json.dumps(SCHEMA), "temperature": 0.0, "max_new_tokens": 80}
# All 5 prompts draft when batched (the default stops drafting above 4 decoding requests).
SPEC = {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 6,
        "speculative_disable_by_batch_size": 8}


def _check_clean(engine: Engine) -> dict:
    info = engine.get_server_info()
    assert info["kv_integrity"] == "ok"
    assert info["num_used_tokens"] == 0, "KV slots leaked after all requests finished"
    return info


@pytest.fixture(scope="module")
def plain() -> Iterator[Engine]:
    with Engine(max_total_tokens=4096) as engine:
        yield engine


@pytest.fixture(scope="module")
def spec() -> Iterator[Engine]:
    with Engine(max_total_tokens=4096, **SPEC) as engine:
        yield engine
        _check_clean(engine)


@pytest.fixture(scope="module")
def reference(plain: Engine) -> list[list[int]]:
    return [o["output_ids"] for o in plain.generate(PROMPTS, GREEDY)]


def test_one_at_a_time_and_batched(spec: Engine, reference: list[list[int]]) -> None:
    outs = [spec.generate(p, GREEDY) for p in PROMPTS]
    assert [o["output_ids"] for o in outs] == reference
    batched = spec.generate(PROMPTS, GREEDY)
    assert [o["output_ids"] for o in batched] == reference
    metas = [o["meta_info"] for o in outs]
    assert sum(m["spec_accepted_tokens"] for m in metas) > 40, metas
    for m in metas:  # accepted tokens are output tokens computed several per forward pass
        assert m["spec_accepted_tokens"] <= m["spec_draft_tokens"]
        assert m["forward_steps"] == m["completion_tokens"] - m["spec_accepted_tokens"]
    assert sum(m["forward_steps"] for m in metas) < 0.85 * 64 * len(PROMPTS)
    info = _check_clean(spec)
    assert info["spec_num_accepted_tokens"] > 0 and 0 < info["spec_accept_rate"] <= 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"disable_radix_cache": True},
        {"chunked_prefill_size": 16},
        {"max_total_tokens": 200, "schedule_conservativeness": 0.0},
    ],
    ids=["no-radix", "chunk16", "retraction"],
)
def test_batched_variants(reference: list[list[int]], kwargs: dict) -> None:
    kwargs = {"max_total_tokens": 4096, **SPEC, **kwargs}
    with Engine(**kwargs) as engine:
        batched = engine.generate(PROMPTS, GREEDY)
        assert [o["output_ids"] for o in batched] == reference
        info = _check_clean(engine)
        assert info["spec_num_accepted_tokens"] > 0
        if kwargs["max_total_tokens"] == 200:
            assert info["num_retractions"] > 0


def test_json_schema_matches(plain: Engine, spec: Engine) -> None:
    expected = plain.generate(JSON_PROMPT, JSON_PARAMS)
    out = spec.generate(JSON_PROMPT, JSON_PARAMS)
    assert out["output_ids"] == expected["output_ids"]
    assert json.loads(out["text"])["name"]  # valid JSON
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    _check_clean(spec)


def test_stop_strings_n_and_logprobs_match(plain: Engine, spec: Engine,
                                           reference: list[list[int]]) -> None:
    text = plain.tokenizer.decode(reference[0])
    stop = text[len(text) // 2 : len(text) // 2 + 6]
    params = {**GREEDY, "stop": [stop], "n": 2}
    kwargs = {"return_logprob": True, "top_logprobs_num": 2}
    expected = plain.generate(PROMPTS[0], params, **kwargs)
    outs = spec.generate(PROMPTS[0], params, **kwargs)
    assert len(outs) == 2
    for out, exp in zip(outs, expected):
        assert out["output_ids"] == exp["output_ids"] and out["text"] == exp["text"]
        assert out["meta_info"]["finish_reason"] == exp["meta_info"]["finish_reason"]
        lps, exp_lps = (o["meta_info"]["output_token_logprobs"] for o in (out, exp))
        assert len(lps) == len(out["output_ids"])
        for lp, exp_lp in zip(lps, exp_lps):
            assert lp[1] == exp_lp[1] and math.isclose(lp[0], exp_lp[0], abs_tol=1e-3)
        tops = out["meta_info"]["output_top_logprobs"]
        assert all(len(t) == 2 for t in tops)
    assert outs[0]["meta_info"]["spec_accepted_tokens"] > 0


def test_stream_sends_accepted_tokens(spec: Engine, reference: list[list[int]]) -> None:
    chunks = list(spec.generate(PROMPTS[3], GREEDY, stream=True))
    assert "".join(c["delta"] for c in chunks) == spec.tokenizer.decode(reference[3])
    meta = chunks[-1]["meta_info"]
    assert chunks[-1]["output_ids"] == reference[3]
    # Several accepted tokens arrive in one chunk: fewer chunks than tokens.
    assert len(chunks) <= meta["forward_steps"] + 1 < len(reference[3])
