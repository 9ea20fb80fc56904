"""A 3,000-token stream through the Engine: what each chunk carries stays bounded (it
holds only what is new, never everything so far), and the pieces join to the output.

A tiny random Llama with the default model's tokenizer, on one thread (no OpenMP
spinning against the other work on the machine), keeps 3,000 tokens fast."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from radixlm import Engine
from radixlm.bench.stream import build_tiny_llama

NUM_TOKENS = 3000
MAX_CHUNK_BYTES = 1500  # a chunk of one or two tokens with their top-2 logprobs


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    model_dir = build_tiny_llama(tmp_path_factory.mktemp("tiny"), context_len=4096)
    with Engine(model_path=str(model_dir), max_total_tokens=4096, grammar_backend="none",
                num_threads=1,
                incremental_streaming_output=True) as eng:
        yield eng
        info = eng.get_server_info()
        assert info["kv_integrity"] == "ok" and info["num_used_tokens"] == 0


def test_long_stream_chunks_stay_small_and_join(engine: Engine) -> None:
    chunks: list[dict[str, Any]] = list(engine.generate(
        "Once upon a time", {"max_new_tokens": NUM_TOKENS, "ignore_eos": True,
                             "temperature": 0.0},
        stream=True, return_logprob=True, top_logprobs_num=2))
    sizes = [len(repr(c)) for c in chunks]
    assert max(sizes) < MAX_CHUNK_BYTES, (max(sizes), sizes.index(max(sizes)))
    ids: list[int] = []
    logprob_ids: list[int] = []
    for c in chunks:
        meta = c["meta_info"]
        assert len(c["output_ids"]) <= 2
        assert len(meta["output_token_logprobs"]) == len(meta["output_top_logprobs"]) == len(
            c["output_ids"])
        assert c["text"] == c["delta"]
        ids.extend(c["output_ids"])
        logprob_ids.extend(e[1] for e in meta["output_token_logprobs"])
    last = chunks[-1]["meta_info"]
    assert last["completion_tokens"] == len(ids) == NUM_TOKENS
    assert last["finish_reason"]["type"] == "length"
    assert logprob_ids == ids
    text = "".join(c["delta"] for c in chunks)
    assert text == engine.tokenizer.decode(ids, skip_special_tokens=True)
