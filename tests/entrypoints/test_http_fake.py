"""The HTTP layer against a fake runtime: routes, translation, errors, security, metrics.

Fast (no model): the real server is tested end to end in test_server_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from _fake_runtime import REPLY, FakeTokenizerManager, byte_tokenizer, fake_starter
from starlette.testclient import TestClient

from radixlm.entrypoints.http.server import create_app
from radixlm.server_args import ServerArgs

KEY = "sk-test"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return byte_tokenizer()


def _client(tm: FakeTokenizerManager, **kwargs: Any) -> TestClient:
    args = ServerArgs(served_model_name="fake-model", **kwargs)
    return TestClient(create_app(args, fake_starter(tm)), raise_server_exceptions=False,
                      base_url="http://localhost")


def _wait_ready(client: TestClient, headers: dict[str, str] | None = None) -> None:
    deadline = time.monotonic() + 10
    while client.get("/health", headers=headers).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.01)


@pytest.fixture
def client(tokenizer: Any) -> Iterator[TestClient]:
    tm = FakeTokenizerManager(tokenizer)
    with _client(tm) as c:
        _wait_ready(c)
        yield c


def _events(resp: Any) -> list[Any]:
    lines = [ln for ln in resp.text.split("\n\n") if ln.strip()]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(ln.removeprefix("data: ")) for ln in lines[:-1]]


def _assert_error(resp: Any, status: int, *words: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"object", "message", "type", "param", "code"}
    assert body["object"] == "error" and body["code"] == status
    for w in words:
        assert w in body["message"], body
    return body


# ---------------------------------------------------------------- native


def test_generate_single_batch_and_stream(client: TestClient) -> None:
    r = client.post("/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 5}})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["text"] == REPLY[:5]
    assert out["meta_info"]["finish_reason"] == {"type": "length", "matched": None}
    assert out["meta_info"]["prompt_tokens"] == 2

    r = client.post("/generate", json={"text": ["a", "bb"], "sampling_params": {"n": 2}})
    assert [o["index"] for o in r.json()] == [0, 1, 2, 3]

    r = client.post("/generate", json={"input_ids": [65, 66], "stream": True,
                                       "sampling_params": {"max_new_tokens": 4}})
    events = _events(r)
    assert "".join(e["delta"] for e in events) == REPLY[:4]
    assert events[-1]["text"] == REPLY[:4]


def test_generate_logprobs_and_stop(client: TestClient) -> None:
    r = client.post("/generate", json={
        "text": "abcd", "return_logprob": True, "logprob_start_len": 1, "top_logprobs_num": 2,
        "sampling_params": {"max_new_tokens": 20, "stop": "\n"}})
    meta = r.json()["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": "\n"}
    assert r.json()["text"] == REPLY.split("\n")[0]
    assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"] - 1
    assert len(meta["output_top_logprobs"][0]) == 2


def test_control_routes(client: TestClient) -> None:
    info = client.get("/get_model_info").json()
    assert info["context_length"] == 256 and info["served_model_name"] == "fake-model"
    info = client.get("/get_server_info").json()
    assert info["num_free_tokens"] == 4096 and "api_key" not in info
    assert client.post("/flush_cache").json()["success"] is True
    assert client.get("/health_generate").status_code == 200
    assert client.post("/abort_request", json={"rid": "nope"}).status_code == 200
    _assert_error(client.post("/abort_request", json={}), 400, "rid")
    _assert_error(client.get("/metrics"), 404, "--enable-metrics")


def test_abort_all_ends_requests_with_abort(tokenizer: Any) -> None:
    tm = FakeTokenizerManager(tokenizer, delay=0.02)
    with _client(tm) as c:
        _wait_ready(c)
        import threading

        results: list[Any] = []

        def run() -> None:
            results.append(c.post("/v1/completions", json={
                "prompt": "x", "max_tokens": 200, "ignore_eos": True}).json())

        threads = [threading.Thread(target=run) for _ in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 5
        while len(tm.states) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert c.post("/abort_request", json={"abort_all": True}).status_code == 200
        for t in threads:
            t.join(10)
        assert [r.get("choices", [{}])[0].get("finish_reason") for r in results] == ["abort"] * 4, results


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("path,body,words", [
    ("/v1/completions", b"{not json", ["Malformed JSON"]),
    ("/v1/completions", b"", ["empty"]),
    ("/v1/completions", b"[1, 2]", ["JSON object"]),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "many"}, ["max_tokens"]),
    ("/v1/completions", {"prompt": "hi", "temperature": -1}, ["temperature"]),
    ("/v1/completions", {"prompt": "hi", "top_p": 1.5}, ["top_p"]),
    ("/v1/completions", {"prompt": "hi", "n": 0}, ["n"]),
    ("/v1/completions", {"prompt": []}, ["empty"]),
    ("/v1/completions", {"prompt": ""}, ["empty"]),
    ("/v1/completions", {"prompt": [[1, 99999]]}, ["vocabulary"]),
    ("/v1/completions", {"prompt": "x" * 300}, ["context length"]),
    ("/v1/completions", {"prompt": "x" * 100, "max_tokens": 200}, ["context length"]),
    ("/v1/completions", {"max_tokens": 3}, ["prompt"]),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"abc": 1}}, ["logit_bias"]),
    ("/v1/chat/completions", {"messages": []}, ["messages"]),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, ["role"]),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, ["content"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "top_logprobs": 2}, ["logprobs"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "continue_final_message": True}, ["assistant"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
     ["fake-model has no vision support"]),
    ("/generate", {"text": "hi", "sampling_params": {"bogus": 1}}, ["bogus"]),
    ("/generate", {"text": "hi", "input_ids": [1]}, ["Exactly one"]),
    ("/generate", {"txt": "hi"}, ["text", "input_ids"]),  # an unknown field is ignored
    ("/generate", {"text": "hi", "image_data": "http://x/y.png"},
     ["fake-model has no vision support"]),
    ("/generate", {"text": "hi", "video_data": [["a.png"]]}, ["no vision support", "video"]),
    ("/v1/detokenize", {"tokens": [1, -5]}, ["vocabulary"]),
])
def test_bad_input_is_400(client: TestClient, path: str, body: Any, words: list[str]) -> None:
    if isinstance(body, bytes):
        r = client.post(path, content=body, headers={"Content-Type": "application/json"})
    else:
        r = client.post(path, json=body)
    _assert_error(r, 400, *words)
    assert client.post("/generate", json={"text": "ok"}).status_code == 200


def test_unknown_model_and_route(client: TestClient) -> None:
    assert client.get("/v1/models").json()["data"][0]["id"] == "fake-model"
    assert client.get("/v1/models/fake-model").json()["id"] == "fake-model"
    body = client.get("/v1/models/other").json()
    assert body["code"] == "model_not_found"
    _assert_error(client.get("/nope"), 404)
    # Any model name is accepted by the generation routes.
    r = client.post("/v1/completions", json={"model": "gpt-4", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["model"] == "gpt-4"


# ---------------------------------------------------------------- OpenAI translation


def test_completions_echo_logprobs_n(client: TestClient, tokenizer: Any) -> None:
    r = client.post("/v1/completions", json={
        "prompt": ["ab", "cde"], "max_tokens": 3, "n": 2, "echo": True, "logprobs": 2})
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    for c in body["choices"]:
        prompt = ["ab", "cde"][c["index"] // 2]
        assert c["text"] == prompt + REPLY[:3]
        lp = c["logprobs"]
        assert len(lp["tokens"]) == len(prompt) + 3
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert all(len(t) == 2 for t in lp["top_logprobs"][1:])
        assert lp["text_offset"][: 3] == [0, 1, 2]
        assert c["finish_reason"] == "length" and c["matched_stop"] is None
    assert body["usage"]["prompt_tokens"] == 5
    assert body["usage"]["completion_tokens"] == 12
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


def test_completions_stream_with_usage(client: TestClient) -> None:
    r = client.post("/v1/completions", json={
        "prompt": [65, 66], "max_tokens": 4, "n": 2, "stream": True,
        "stream_options": {"include_usage": True}, "logprobs": 0})
    events = _events(r)
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 8
    for i in (0, 1):
        chunks = [e["choices"][0] for e in events[:-1] if e["choices"][0]["index"] == i]
        assert "".join(c["text"] for c in chunks) == REPLY[:4]
        assert [c["finish_reason"] for c in chunks].count("length") == 1
        assert sum(len(c["logprobs"]["tokens"]) for c in chunks) == 4


def test_chat_and_chat_stream(client: TestClient) -> None:
    msgs = [{"role": "system", "content": "s"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    body = client.post("/v1/chat/completions", json={
        "messages": msgs, "max_tokens": 5, "logprobs": True, "top_logprobs": 2}).json()
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": REPLY[:5], "tool_calls": None,
                                 "reasoning_content": None}
    content = choice["logprobs"]["content"]
    assert len(content) == 5 and len(content[0]["top_logprobs"]) == 2
    assert content[0]["bytes"] == list(REPLY[0].encode())
    r = client.post("/v1/chat/completions", json={
        "messages": msgs, "max_tokens": 3, "n": 2, "stream": True,
        "stream_options": {"include_usage": True}})
    events = _events(r)
    for i in (0, 1):
        deltas = [e["choices"][0] for e in events if e["choices"] and
                  e["choices"][0]["index"] == i]
        # SGLang's shape: reasoning_content in every delta, null when there is none.
        assert deltas[0]["delta"] == {"role": "assistant", "content": "",
                                      "reasoning_content": None}
        assert all(d["delta"]["reasoning_content"] is None for d in deltas)
        assert "".join(d["delta"].get("content", "") for d in deltas) == REPLY[:3]
        assert sum(d["finish_reason"] is not None for d in deltas) == 1
    assert events[-1]["usage"]["completion_tokens"] == 6


def test_chat_stop_and_continue_final_message(client: TestClient) -> None:
    body = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "stop": "\n"}).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["matched_stop"] == "\n"
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"},
                     {"role": "assistant", "content": "Sure"}],
        "continue_final_message": True, "max_tokens": 1})
    assert r.status_code == 200, r.text


def test_tokenize_detokenize(client: TestClient, tokenizer: Any) -> None:
    body = client.post("/v1/tokenize", json={"prompt": "héllo"}).json()
    assert body["tokens"] == tokenizer.encode("héllo") and body["count"] == 6
    assert body["max_model_len"] == 256
    assert client.post("/v1/detokenize", json={"tokens": body["tokens"]}).json() == {
        "text": "héllo"}


# ---------------------------------------------------------------- health, security, metrics


def test_health_is_503_until_ready(tokenizer: Any) -> None:
    tm = FakeTokenizerManager(tokenizer)
    ready_holder: list[asyncio.Event] = []

    async def start(args: ServerArgs) -> Any:
        ready_holder.append(asyncio.Event())
        await ready_holder[0].wait()
        return await fake_starter(tm)(args)

    app = create_app(ServerArgs(), start)
    with TestClient(app, base_url="http://localhost") as c:
        _assert_error(c.get("/health"), 503, "loading")
        _assert_error(c.post("/generate", json={"text": "x"}), 503)
        c.portal.call(ready_holder[0].set)  # type: ignore[union-attr]
        _wait_ready(c)
    assert tm.closed


def test_api_key_and_body_limit(tokenizer: Any) -> None:
    tm = FakeTokenizerManager(tokenizer)
    with _client(tm, api_key=KEY, max_request_bytes=1000, enable_metrics=True) as c:
        _wait_ready(c)
        _assert_error(c.get("/v1/models"), 401, "Missing")
        _assert_error(c.get("/v1/models", headers={"Authorization": "Bearer bad"}), 401)
        _assert_error(c.get("/get_server_info"), 401)
        assert c.get("/v1/models", headers=AUTH).status_code == 200
        r = c.post("/generate", json={"text": "x" * 2000}, headers=AUTH)
        _assert_error(r, 413, "larger")

        def chunks() -> Iterator[bytes]:
            yield b'{"text": "'
            for _ in range(10):
                yield b"x" * 200
            yield b'"}'

        _assert_error(c.post("/generate", content=chunks(), headers=AUTH), 413)
        assert c.post("/generate", json={"text": "hi", "sampling_params": {
            "max_new_tokens": 3}}, headers=AUTH).status_code == 200
        _assert_error(c.get("/metrics"), 401)
        text = c.get("/metrics", headers=AUTH).text
        for series in ("radixlm:num_running_reqs", "radixlm:num_queue_reqs",
                       "radixlm:token_usage", "radixlm:cache_hit_rate",
                       "radixlm:prompt_tokens_total", "radixlm:generation_tokens_total",
                       "radixlm:time_to_first_token_seconds_bucket",
                       "radixlm:time_per_output_token_seconds_bucket",
                       "radixlm:e2e_request_latency_seconds_bucket"):
            assert series in text, series
        assert 'radixlm:cache_hit_rate{model_name="fake-model"} 0.4' in text


def test_dead_engine_is_503(tokenizer: Any) -> None:
    tm = FakeTokenizerManager(tokenizer)
    with _client(tm) as c:
        _wait_ready(c)
        tm.dead_reason = "The radixlm-scheduler process exited unexpectedly"
        _assert_error(c.post("/generate", json={"text": "x"}), 503, "exited")
        _assert_error(c.get("/health"), 503, "exited")
        state = c.app.state.server  # type: ignore[attr-defined]
        deadline = time.monotonic() + 5
        while state.exit_code != 1:  # the server's monitor notices within 0.25 s
            assert time.monotonic() < deadline
            time.sleep(0.02)


def test_null_sglang_extras_are_ignored(client: TestClient) -> None:
    r = client.post("/generate", json={"text": "hi", "image_data": None, "lora_path": None,
                                       "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200, r.text


def test_health_generate_503_when_scheduler_is_silent(tokenizer: Any) -> None:
    tm = FakeTokenizerManager(tokenizer, delay=30.0)  # never answers in time
    with _client(tm, watchdog_timeout=0.3) as c:
        _wait_ready(c)
        _assert_error(c.get("/health_generate"), 503, "did not answer")
