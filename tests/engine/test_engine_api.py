"""The Engine API on the default model: streaming, sampling, stops, logprobs, n, abort, errors."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from radixlm import Engine
from radixlm.tokenizer.tokenizer_manager import EngineDeadError

PROMPT = "Once upon a time, in a small village,"
GREEDY = {"temperature": 0.0, "max_new_tokens": 24, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine():
    with Engine(max_total_tokens=4096) as eng:
        yield eng
        info = eng.get_server_info()
        assert info["kv_integrity"] == "ok"


@pytest.fixture(autouse=True)
def kv_is_clean_after_each_test(engine: Engine):
    yield
    info = engine.get_server_info()
    assert info["kv_integrity"] == "ok"
    assert info["num_used_tokens"] == 0 and info["num_running_reqs"] == 0


def test_async_generate_and_stream(engine: Engine) -> None:
    async def run() -> tuple[dict, list[dict]]:
        full = await engine.async_generate(PROMPT, GREEDY)
        stream = await engine.async_generate(PROMPT, GREEDY, stream=True)
        return full, [chunk async for chunk in stream]

    full, chunks = asyncio.run(run())
    assert "".join(c["delta"] for c in chunks) == full["text"]
    assert full["meta_info"]["completion_tokens"] == GREEDY["max_new_tokens"]


def test_stream_pieces_join_to_full_text(engine: Engine) -> None:
    full = engine.generate(PROMPT, GREEDY)
    chunks = list(engine.generate(PROMPT, GREEDY, stream=True))
    assert "".join(c["delta"] for c in chunks) == full["text"]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert sum(c["meta_info"]["finish_reason"] is not None for c in chunks) == 1
    assert full["text"] == engine.tokenizer.decode(full["output_ids"], skip_special_tokens=True)


def test_cumulative_stream_chunks_keep_what_they_held(engine: Engine) -> None:
    """Each chunk holds the text, ids and logprobs so far, and later chunks leave it as it
    was (they share no lists with it)."""
    chunks = list(engine.generate(PROMPT, {**GREEDY, "max_new_tokens": 8}, stream=True,
                                  return_logprob=True, top_logprobs_num=2))
    text = ""
    for chunk in chunks:
        meta = chunk["meta_info"]
        text += chunk["delta"]
        assert chunk["text"] == text
        assert len(meta["output_token_logprobs"]) == len(chunk["output_ids"])
        assert len(chunk["output_ids"]) == meta["completion_tokens"]
    assert chunks[-1]["meta_info"]["completion_tokens"] == 8


def test_seeded_sampling_repeats_and_top_k_1_is_greedy(engine: Engine) -> None:
    params = {"temperature": 1.0, "max_new_tokens": 16, "seed": 1234, "ignore_eos": True}
    a = engine.generate(PROMPT, params)
    b = engine.generate(PROMPT, params)
    assert a["output_ids"] == b["output_ids"]
    greedy = engine.generate(PROMPT, {**GREEDY, "max_new_tokens": 16})
    top1 = engine.generate(PROMPT, {**params, "top_k": 1, "seed": None})
    assert top1["output_ids"] == greedy["output_ids"]


def test_stop_string_and_stop_token(engine: Engine) -> None:
    greedy = engine.generate(PROMPT, GREEDY)
    text = greedy["text"]
    words = [w for w in text.split() if len(w) > 3 and text.index(w) > 5]
    stop = words[0]
    stopped = engine.generate(PROMPT, {**GREEDY, "stop": [stop]})
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert stopped["text"] == text[: text.index(stop)]
    stop_id = greedy["output_ids"][5]
    out = engine.generate(PROMPT, {**GREEDY, "stop_token_ids": [stop_id]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    assert out["output_ids"] == greedy["output_ids"][: greedy["output_ids"].index(stop_id) + 1]
    # The stop string is never streamed, not even in part.
    chunks = list(engine.generate(PROMPT, {**GREEDY, "stop": [stop]}, stream=True))
    assert "".join(c["delta"] for c in chunks) == stopped["text"]


def test_logprobs_shapes(engine: Engine) -> None:
    out = engine.generate(PROMPT, {**GREEDY, "max_new_tokens": 6}, return_logprob=True,
                          logprob_start_len=0, top_logprobs_num=3)
    meta = out["meta_info"]
    assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] == 6
    assert all(len(tops) == 3 for tops in meta["output_top_logprobs"])
    assert [e[1] for e in meta["output_token_logprobs"]] == out["output_ids"]
    assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"]
    first_id = engine.tokenizer.encode(PROMPT)[0]
    assert meta["input_token_logprobs"][0] == [None, first_id, engine.tokenizer.decode([first_id])]
    assert all(e[0] is not None for e in meta["input_token_logprobs"][1:])
    # Greedy picks the top-1 token, whose logprob is the row's maximum.
    for chosen, tops in zip(meta["output_token_logprobs"], meta["output_top_logprobs"]):
        assert chosen[1] == tops[0][1] and abs(chosen[0] - tops[0][0]) < 1e-5
    start = 3
    out = engine.generate(PROMPT, {**GREEDY, "max_new_tokens": 2}, return_logprob=True,
                          logprob_start_len=start)
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == start + len(meta["input_token_logprobs"])
    # SGLang's default: return_logprob alone brings the whole prompt's logprobs too.
    out = engine.generate(PROMPT, {**GREEDY, "max_new_tokens": 1}, return_logprob=True)
    meta = out["meta_info"]
    assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"]
    assert meta["input_token_logprobs"][0][0] is None


def test_parallel_samples(engine: Engine) -> None:
    outs = engine.generate(PROMPT + " there lived", {"temperature": 1.0, "max_new_tokens": 8,
                                                      "n": 3, "ignore_eos": True})
    assert len(outs) == 3
    assert [o["index"] for o in outs] == [0, 1, 2]
    assert all(o["meta_info"]["completion_tokens"] == 8 for o in outs)
    assert sum(o["meta_info"]["cached_tokens"] > 0 for o in outs) >= 2


def test_batch_with_different_params(engine: Engine) -> None:
    outs = engine.generate([PROMPT, "Hello"], [{**GREEDY, "max_new_tokens": 3},
                                               {**GREEDY, "max_new_tokens": 5}])
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [3, 5]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"sampling_params": {"temperature": -1}}, "temperature"),
        ({"sampling_params": {"top_p": 0}}, "top_p"),
        ({"sampling_params": {"min_new_tokens": 9, "max_new_tokens": 3}}, "min_new_tokens"),
        ({"sampling_params": {"max_new_tokens": 10**7}}, "context length"),
        ({"sampling_params": {"bogus": 1}}, "bogus"),
        ({"prompt": ""}, "empty"),
        ({"prompt": None, "input_ids": [1, 10**9]}, "vocabulary"),
    ],
)
def test_bad_requests_raise_clear_errors(engine: Engine, kwargs: dict, message: str) -> None:
    kwargs = {"prompt": PROMPT, **kwargs}
    with pytest.raises(ValueError, match=message):
        engine.generate(**kwargs)
    assert engine.generate("Hi", {"max_new_tokens": 1})["meta_info"]["completion_tokens"] == 1


def test_abort_all(engine: Engine) -> None:
    results: list = []

    def run() -> None:
        results.append(engine.generate([PROMPT] * 4, {"max_new_tokens": 2000, "ignore_eos": True,
                                                      "temperature": 0.0}))

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(1.0)
    engine.abort(abort_all=True)
    thread.join(60)
    assert not thread.is_alive()
    assert all(o["meta_info"]["finish_reason"]["type"] == "abort" for o in results[0])
    assert engine.get_server_info()["num_used_tokens"] == 0


def test_dead_child_makes_engine_raise() -> None:
    engine = Engine(max_total_tokens=1024)
    try:
        scheduler = next(p for p in engine._procs if "scheduler" in p.name)
        scheduler.kill()
        scheduler.join(10)
        time.sleep(1.5)
        with pytest.raises(EngineDeadError):
            engine.generate("Hi", {"max_new_tokens": 4})
    finally:
        engine.shutdown()
    assert not any(p.is_alive() for p in engine._procs)
