"""`--tp-size 3` through the Engine on the default model: greedy output equals TP=1's,
token for token (5 prompts x 32 tokens, batched, with a shared prefix); `--tp-size 2`
(9 query heads, 3 KV heads) is refused at start-up with the sizes that fit."""

from __future__ import annotations

import pytest

from radixlm import Engine

PROMPTS = [
    "The capital of France is",
    "Here is a short poem about the sea:\n",
    "def fibonacci(n):",
    "Three facts about elephants: 1.",
    "Three facts about elephants: 1. They",  # shares a cached prefix with the one above
]
GREEDY = {"temperature": 0.0, "max_new_tokens": 32, "ignore_eos": True}
ENGINE = dict(max_total_tokens=2048, chunked_prefill_size=16)  # chunked prompts


def _outputs(engine: Engine) -> list[list[int]]:
    first = engine.generate(PROMPTS[3], GREEDY)  # cached, so the batch below hits it
    outs = engine.generate(PROMPTS, GREEDY)
    return [first["output_ids"]] + [o["output_ids"] for o in outs]


@pytest.fixture(scope="module")
def tp1_outputs() -> list[list[int]]:
    with Engine(**ENGINE) as engine:
        return _outputs(engine)


def test_tp3_greedy_equals_tp1(tp1_outputs: list[list[int]]) -> None:
    with Engine(tp_size=3, **ENGINE) as engine:
        got = _outputs(engine)
        info = engine.get_server_info()
        assert info["kv_integrity"] == "ok"
    assert got == tp1_outputs
    assert all(len(ids) == 32 for ids in got)


def test_tp2_refused_at_start_up() -> None:
    with pytest.raises(ValueError, match=r"--tp-size 2 cannot split this model: it has 9 "
                                         r"attention heads, 3 KV heads.*fit: 1, 3"):
        Engine(tp_size=2, **ENGINE)
