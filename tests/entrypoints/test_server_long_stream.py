"""3,000-token streams through the server: every event of the native stream (with
--incremental-streaming-output) and of the OpenAI completions stream carries only what is
new, so events stay small however long the stream gets, and the pieces join to the output.

A tiny random Llama with the default model's tokenizer, on one thread (no OpenMP
spinning against the other work on the machine), keeps 3,000 tokens fast; both
streams run at once."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
from _server_process import ServerProcess

from radixlm.bench.stream import build_tiny_llama

NUM_TOKENS = 3000
MAX_EVENT_BYTES = 1500
PROMPT = "Once upon a time"


def _events(url: str, path: str, body: dict[str, Any], out: list[str]) -> None:
    with httpx.stream("POST", url + path, json=body, timeout=600) as r:
        out.extend(line[6:] for line in r.iter_lines() if line.startswith("data: "))


def test_long_streams_carry_deltas(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    model_dir = build_tiny_llama(tmp_path / "tiny", context_len=4096)
    srv = ServerProcess(tmp_path / "server.log", "--model-path", str(model_dir),
                        "--grammar-backend", "none", "--num-threads", "1",
                        "--incremental-streaming-output")
    try:
        srv.wait_healthy()
        native: list[str] = []
        openai: list[str] = []
        greedy = {"max_new_tokens": NUM_TOKENS, "ignore_eos": True, "temperature": 0.0}
        threads = [
            threading.Thread(target=_events, args=(srv.url, "/generate", {
                "text": PROMPT, "stream": True, "return_logprob": True, "top_logprobs_num": 2,
                "sampling_params": greedy}, native)),
            threading.Thread(target=_events, args=(srv.url, "/v1/completions", {
                "prompt": PROMPT, "stream": True, "max_tokens": NUM_TOKENS, "logprobs": 2,
                "ignore_eos": True, "temperature": 0.0}, openai)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        assert native[-1] == "[DONE]" and openai[-1] == "[DONE]", srv.log_tail()
        for events in (native, openai):
            sizes = [len(e) for e in events]
            assert max(sizes) < MAX_EVENT_BYTES, (max(sizes), sizes.index(max(sizes)))

        native_events = [json.loads(e) for e in native[:-1]]
        ids = [i for e in native_events for i in e["output_ids"]]
        lp_ids = [lp[1] for e in native_events for lp in e["meta_info"]["output_token_logprobs"]]
        text = "".join(e["text"] for e in native_events)
        last = native_events[-1]["meta_info"]
        assert last["completion_tokens"] == len(ids) == NUM_TOKENS == len(lp_ids)
        assert lp_ids == ids
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        assert text == tokenizer.decode(ids, skip_special_tokens=True)

        chunks = [json.loads(e) for e in openai[:-1]]
        assert "".join(c["choices"][0]["text"] for c in chunks) == text
        assert sum(len(c["choices"][0]["logprobs"]["tokens"]) for c in chunks) == NUM_TOKENS
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        info = httpx.get(srv.url + "/get_server_info", timeout=30).json()
        assert info["kv_integrity"] == "ok" and info["num_used_tokens"] == 0
    finally:
        srv.stop()
