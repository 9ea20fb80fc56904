"""End to end: the real server with the default model, through `openai` and plain HTTP.

Outputs are kept short (the default model decodes ~20-40 tokens/s on 2 cores).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any

import httpx
import openai
import pytest
from _server_process import API_KEY, AUTH, ServerProcess

STORY = "Once upon a time, in a small village by the sea, there lived"
LIST_PROMPT = "Fruits:\n1. apples\n2. bananas\n3. cherries\n4."


def _idle_kv(http: httpx.Client, timeout: float = 30.0) -> dict[str, Any]:
    """Server info once no request runs or waits (fails after `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        info = http.get("/get_server_info").json()
        if info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0:
            return info
        assert time.monotonic() < deadline, info
        time.sleep(0.1)


# ---------------------------------------------------------------- completions


@pytest.mark.parametrize("echo,logprobs,n", list(itertools.product(
    [False, True], [None, 2], [1, 2])))
def test_completions_grid(oai: Any, tokenizer: Any, echo: bool, logprobs: int | None,
                          n: int) -> None:
    ids = tokenizer.encode(STORY)
    prompts: list[Any] = [STORY, [STORY, "Hello"], ids]
    for prompt in prompts:
        texts = [prompt] if isinstance(prompt, str) else prompt
        if isinstance(prompt[0], int):
            texts = [tokenizer.decode(prompt)]
        r = oai.completions.create(model="default", prompt=prompt, max_tokens=2, n=n, echo=echo,
                                   logprobs=logprobs, temperature=0.7, seed=1)
        assert len(r.choices) == len(texts) * n
        assert sorted(c.index for c in r.choices) == list(range(len(texts) * n))
        num_prompt = sum(len(tokenizer.encode(t)) for t in texts)
        assert r.usage.prompt_tokens == num_prompt
        assert len(r.choices) <= r.usage.completion_tokens <= 2 * len(r.choices)
        for c in r.choices:
            prompt_text = texts[c.index // n]
            if echo:
                assert c.text.startswith(prompt_text)
            if logprobs is None:
                assert c.logprobs is None
                continue
            lp = c.logprobs
            prompt_len = len(tokenizer.encode(prompt_text)) if echo else 0
            assert 1 <= len(lp.tokens) - prompt_len <= 2
            assert len(lp.token_logprobs) == len(lp.tokens) == len(lp.top_logprobs)
            assert len(lp.text_offset) == len(lp.tokens)
            assert all(x is not None for x in lp.token_logprobs[1:])
            assert all(0 < len(t) <= logprobs for t in lp.top_logprobs[1:])
            if echo:
                assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
                assert "".join(lp.tokens[:prompt_len]) == prompt_text


def test_completions_stream_with_usage(oai: Any) -> None:
    chunks = list(oai.completions.create(
        model="m", prompt=STORY, max_tokens=4, n=2, stream=True,
        stream_options={"include_usage": True}, temperature=0.8))
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == 8
    for i in (0, 1):
        finishes = [c.choices[0].finish_reason for c in chunks[:-1] if c.choices[0].index == i]
        assert [f for f in finishes if f] == ["length"]


def test_stop_length_and_ignore_eos(oai: Any) -> None:
    r = oai.completions.create(model="m", prompt=LIST_PROMPT, max_tokens=16, temperature=0,
                               stop="\n")
    choice = r.choices[0]
    assert choice.finish_reason == "stop" and choice.model_extra["matched_stop"] == "\n"
    assert "\n" not in choice.text
    r = oai.completions.create(model="m", prompt=STORY, max_tokens=5, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    r = oai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Say OK."}], max_tokens=24,
        temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 24 and r.choices[0].finish_reason == "length"


# ---------------------------------------------------------------- chat


def test_chat(oai: Any) -> None:
    r = oai.chat.completions.create(
        model="anything", temperature=0, max_tokens=8, logprobs=True, top_logprobs=2,
        messages=[{"role": "system", "content": "You are terse."},
                  {"role": "user", "content": "What is the capital of France?"}])
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert len(choice.logprobs.content) == r.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 for t in choice.logprobs.content)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_roles_and_finish(oai: Any) -> None:
    chunks = list(oai.chat.completions.create(
        model="m", max_tokens=6, n=2, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Count to five."}]))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 2
    for i in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
        assert mine[0].delta.role == "assistant"
        assert all(c.delta.role is None for c in mine[1:])
        assert sum(c.finish_reason is not None for c in mine) == 1
        assert mine[-1].finish_reason in ("stop", "length")


# ---------------------------------------------------------------- native


def test_generate_batch_stream_and_logprobs(http: httpx.Client) -> None:
    r = http.post("/generate", json={"text": [STORY, "Hello"],
                                     "sampling_params": {"max_new_tokens": 3, "temperature": 0}})
    outs = r.json()
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [3, 3]

    with http.stream("POST", "/generate", json={
            "input_ids": [1, 2, 3, 4], "stream": True,
            "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}) as r:
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    events = [json.loads(ln) for ln in lines[:-1]]
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert "".join(e["delta"] for e in events) == events[-1]["text"]

    r = http.post("/generate", json={
        "text": STORY, "return_logprob": True, "logprob_start_len": 3, "top_logprobs_num": 3,
        "sampling_params": {"max_new_tokens": 2}})
    meta = r.json()["meta_info"]
    assert meta["prompt_tokens"] == 3 + len(meta["input_token_logprobs"])
    assert len(meta["output_token_logprobs"]) == 2
    assert all(len(t) == 3 for t in meta["output_top_logprobs"])


def test_cached_tokens_and_flush(http: httpx.Client) -> None:
    prompt = STORY + " a fisherman who had never seen a whale."
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 1}}
    http.post("/generate", json=body)
    second = http.post("/generate", json=body).json()["meta_info"]
    assert second["cached_tokens"] > 0
    _idle_kv(http)
    r = http.post("/flush_cache")
    assert r.status_code == 200, r.text
    third = http.post("/generate", json=body).json()["meta_info"]
    assert third["cached_tokens"] == 0


def test_info_routes(http: httpx.Client, server: ServerProcess) -> None:
    info = http.get("/get_model_info").json()
    assert info["context_length"] > 0 and info["vocab_size"] > 0
    info = http.get("/get_server_info").json()
    for key in ("num_free_tokens", "num_used_tokens", "max_total_num_tokens"):
        assert key in info
    assert info["max_total_num_tokens"] == 8192 and info["kv_integrity"] == "ok"
    assert http.get("/health_generate").status_code == 200
    assert http.get("/v1/models").json()["data"][0]["id"] == "SmolLM2-135M-Instruct"
    r = http.get("/v1/models/no-such-model")
    assert r.status_code == 404 and r.json()["code"] == "model_not_found"
    ids = http.post("/v1/tokenize", json={"prompt": "Hello world"}).json()["tokens"]
    assert http.post("/v1/detokenize", json={"tokens": ids}).json()["text"] == "Hello world"


# ---------------------------------------------------------------- bad input


BAD_REQUESTS: list[tuple[str, Any, str]] = [
    ("/v1/completions", b'{"prompt": "hi", ', "Malformed JSON"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "ten"}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "temperature": -0.5}, "temperature"),
    ("/v1/completions", {"prompt": "hi", "top_p": 0}, "top_p"),
    ("/v1/completions", {"prompt": "hi", "n": 1000}, "n"),
    ("/v1/completions", {"prompt": "hi " * 9000}, "context length"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 9000}, "context length"),
    ("/v1/completions", {"prompt": [[1, 10 ** 7]]}, "vocabulary"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "king", "content": "hi"}]}, "role"),
    ("/v1/chat/completions", {"messages": "hi"}, "messages"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    ("/generate", {"text": 5}, "text"),
    ("/generate", {"input_ids": [[]]}, "empty"),
    ("/generate", {"text": "<image> hi", "image_data": "aGk="}, "has no vision support"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}}]}]},
     "The model SmolLM2-135M-Instruct has no vision support"),
]


@pytest.mark.parametrize("path,body,word", BAD_REQUESTS)
def test_bad_input_400(http: httpx.Client, path: str, body: Any, word: str) -> None:
    if isinstance(body, bytes):
        r = http.post(path, content=body, headers={"Content-Type": "application/json"})
    else:
        r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["object"] == "error" and err["type"] == "BadRequestError" and err["code"] == 400
    assert word in err["message"], err
    assert http.get("/health").status_code == 200


def test_bad_input_through_openai_client(oai: Any) -> None:
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model="m", messages=[])
    r = oai.completions.create(model="m", prompt="ok", max_tokens=1)
    assert r.choices[0].finish_reason == "length"


# ---------------------------------------------------------------- abort, disconnect, load


def test_abort_all_running(http: httpx.Client, server: ServerProcess) -> None:
    async def main() -> list[Any]:
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=120) as c:
            body = {"text": STORY, "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
            tasks = [asyncio.create_task(c.post("/generate", json=body)) for _ in range(16)]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                info = (await c.get("/get_server_info")).json()
                if info["num_running_reqs"] + info["num_waiting_reqs"] == 16:
                    break
                await asyncio.sleep(0.1)
            r = await c.post("/abort_request", json={"abort_all": True})
            assert r.status_code == 200
            return [(await t).json() for t in tasks]

    outs = asyncio.run(main())
    assert [o["meta_info"]["finish_reason"]["type"] for o in outs] == ["abort"] * 16
    info = _idle_kv(http)
    assert info["num_used_tokens"] == 0 and info["kv_integrity"] == "ok"


def test_client_disconnect_frees_kv(http: httpx.Client, server: ServerProcess) -> None:
    body = {"text": STORY, "stream": True,
            "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}}
    with httpx.stream("POST", server.url + "/generate", json=body, headers=AUTH,
                      timeout=60) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i >= 4:
                break  # leaving the block closes the connection mid-stream
    info = _idle_kv(http, timeout=10)
    assert info["num_used_tokens"] == 0
    # Non-streaming: the client gives up (read timeout) and closes its connection.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/generate", json={**body, "stream": False}, headers=AUTH,
                   timeout=httpx.Timeout(60, read=1.5))
    info = _idle_kv(http, timeout=10)
    assert info["num_used_tokens"] == 0 and info["kv_integrity"] == "ok"


def test_32_concurrent_requests(server: ServerProcess) -> None:
    async def main() -> list[Any]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY,
                                    max_retries=0, timeout=300)
        calls = [client.completions.create(model="m", prompt=f"{i} + {i} =", max_tokens=8,
                                           extra_body={"ignore_eos": True})
                 for i in range(32)]
        try:
            return list(await asyncio.gather(*calls))
        finally:
            await client.close()

    results = asyncio.run(main())
    assert all(r.choices[0].finish_reason == "length" for r in results)
    assert all(r.usage.completion_tokens == 8 for r in results)


# ---------------------------------------------------------------- security, metrics


def test_api_key(server: ServerProcess) -> None:
    assert httpx.get(server.url + "/health").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = httpx.get(server.url + "/v1/models", headers=headers)
        assert r.status_code == 401 and r.json()["object"] == "error"
        assert httpx.post(server.url + "/generate", json={"text": "x"},
                          headers=headers).status_code == 401
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_metrics(http: httpx.Client) -> None:
    http.post("/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 3}})
    text = http.get("/metrics").text
    for series in ("radixlm:num_running_reqs", "radixlm:num_queue_reqs", "radixlm:token_usage",
                   "radixlm:cache_hit_rate", "radixlm:prompt_tokens_total",
                   "radixlm:generation_tokens_total", "radixlm:time_to_first_token_seconds_bucket",
                   "radixlm:time_per_output_token_seconds_bucket",
                   "radixlm:e2e_request_latency_seconds_count"):
        assert series in text, series


def test_request_too_large(server: ServerProcess) -> None:
    r = httpx.post(server.url + "/generate", content=b"x" * (33 * 1024 * 1024),
                   headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 413


def test_usage_counts_jump_forward_tokens(oai: Any) -> None:
    """radixlm's usage extra, from the real runtime: a regex with one continuation is
    appended by jump-forward, and a continuous-usage stream reports it as it grows."""
    regex = r'\{"answer": "(yes|no)", "sure": (true|false)\}'
    messages = [{"role": "user", "content": "Is the sky blue? Answer in JSON."}]
    r = oai.chat.completions.create(model="default", messages=messages, max_tokens=24,
                                    temperature=0, extra_body={"regex": regex})
    usage = r.usage.model_dump()
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert 0 < usage["completion_tokens_details"]["jump_forward_tokens"] < usage[
        "completion_tokens"]
    chunks = list(oai.chat.completions.create(
        model="default", messages=messages, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"regex": regex}))
    jumped = [c.usage.model_dump()["completion_tokens_details"]["jump_forward_tokens"]
              for c in chunks]
    assert jumped == sorted(jumped) and jumped[-1] == usage["completion_tokens_details"][
        "jump_forward_tokens"]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        r.choices[0].message.content
