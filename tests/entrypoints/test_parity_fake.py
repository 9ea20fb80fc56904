"""SGLang / OpenAI parity on the fake runtime: stored responses and the Responses API's
error shape, the thinking budget's fields, the score route without items, and the
server's bounds (the response store's size and expiry)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from _fake_runtime import FakeTokenizerManager, byte_tokenizer, fake_starter
from starlette.testclient import TestClient

from radixlm.entrypoints.http.server import create_app
from radixlm.entrypoints.openai.response_store import ResponseStore
from radixlm.server_args import ServerArgs

REPLY = "<think>\nhm\n</think>\n\nSunny.$"


def _serve(**args: Any) -> Iterator[tuple[TestClient, FakeTokenizerManager]]:
    tm = FakeTokenizerManager(byte_tokenizer(), context_length=4096, reply=REPLY)
    app = create_app(ServerArgs(served_model_name="fake", **args), fake_starter(tm))
    with TestClient(app, raise_server_exceptions=False, base_url="http://localhost") as c:
        for _ in range(1000):
            if c.get("/health").status_code == 200:
                break
        yield c, tm


@pytest.fixture(scope="module")
def thinker() -> Iterator[tuple[TestClient, FakeTokenizerManager]]:
    yield from _serve(reasoning_parser="qwen3", reasoning_budget=64)


@pytest.fixture(scope="module")
def plain() -> Iterator[tuple[TestClient, FakeTokenizerManager]]:
    yield from _serve()


def _respond(c: TestClient, **body: Any) -> Any:
    return c.post("/v1/responses", json={"input": "Weather?", "max_output_tokens": 40,
                                         "stop": "$", **body})


def test_responses_are_stored_and_continued(thinker: Any) -> None:
    c, tm = thinker
    first = _respond(c).json()
    assert first["store"] is True and first["previous_response_id"] is None
    usage = first["usage"]
    assert usage["input_tokens_details"] == {"cached_tokens": usage["input_tokens_details"][
        "cached_tokens"], "cache_write_tokens": 0}
    assert 0 < usage["output_tokens_details"]["reasoning_tokens"] < usage["output_tokens"]
    assert c.get(f"/v1/responses/{first['id']}").json() == first
    second = _respond(c, input="And tomorrow?", previous_response_id=first["id"],
                      instructions="Be brief.").json()
    assert second["previous_response_id"] == first["id"]
    prompt = tm.tokenizer.decode(tm.received[-1].input_ids)
    # The earlier turn and its answer (reasoning not replayed), then the new input.
    assert prompt.index("Weather?") < prompt.index("Sunny.") < prompt.index("And tomorrow?")
    assert "hm" not in prompt and prompt.count("Be brief.") == 1
    gone = c.delete(f"/v1/responses/{first['id']}")
    assert gone.json() == {"id": first["id"], "object": "response", "deleted": True}
    assert c.get(f"/v1/responses/{first['id']}").status_code == 404
    unstored = _respond(c, store=False).json()
    assert unstored["store"] is False
    assert c.get(f"/v1/responses/{unstored['id']}").status_code == 404


def test_a_streamed_response_is_stored_too(thinker: Any) -> None:
    c, _ = thinker
    r = _respond(c, stream=True)
    events = [json.loads(line[6:]) for line in r.text.split("\n")
              if line.startswith("data: {")]
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed"
    assert c.get(f"/v1/responses/{final['id']}").json() == final


@pytest.mark.parametrize("request_args, status, param", [
    ({"method": "POST", "url": "/v1/responses", "json": {"input": "x",
      "previous_response_id": "resp_nope"}}, 404, "previous_response_id"),
    ({"method": "POST", "url": "/v1/responses", "json": {"input": "x",
      "previous_response_id": "nope"}}, 400, "previous_response_id"),
    ({"method": "GET", "url": "/v1/responses/resp_nope"}, 404, "response_id"),
    ({"method": "DELETE", "url": "/v1/responses/x"}, 400, "response_id"),
    ({"method": "POST", "url": "/v1/responses", "json": {"input": 3}}, 400, "input"),
    ({"method": "POST", "url": "/v1/responses", "json": {"input": "x", "tools": [
      {"type": "web_search"}]}}, 400, "tools"),
])
def test_responses_errors_have_the_responses_shape(thinker: Any, request_args: dict,
                                                   status: int, param: str) -> None:
    c, _ = thinker
    r = c.request(**request_args)
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and body["error"]["param"] == param
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"]
    assert body["error"]["code"] == status
    client = openai.OpenAI(base_url="http://localhost/v1", api_key="x", http_client=c,
                           max_retries=0)
    with pytest.raises(openai.NotFoundError, match="not found"):
        client.responses.retrieve("resp_nope")


def test_thinking_token_budget_reaches_the_runtime(thinker: Any, plain: Any) -> None:
    c, tm = thinker
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    c.post("/v1/chat/completions", json={**chat, "thinking_token_budget": 7})
    sent = tm.received[-1].sampling_params
    assert sent["thinking_token_budget"] == 7 and sent["reasoning_phase"] == "start"
    c.post("/v1/chat/completions", json=chat)  # the server's --reasoning-budget applies
    assert "thinking_token_budget" not in tm.received[-1].sampling_params
    _respond(c, reasoning={"max_tokens": 3})
    assert tm.received[-1].sampling_params["thinking_token_budget"] == 3
    r = c.post("/v1/chat/completions", json={**chat, "thinking_token_budget": -1})
    assert r.status_code == 400 and "thinking_token_budget" in r.json()["message"]
    p, _ = plain
    r = p.post("/v1/chat/completions", json={**chat, "thinking_token_budget": 7})
    assert r.status_code == 400 and "--reasoning-parser" in r.json()["message"]


def test_score_without_items_is_empty(plain: Any) -> None:
    c, _ = plain
    r = c.post("/v1/score", json={"query": "q", "items": [], "label_token_ids": [65]})
    assert r.status_code == 200, r.text
    assert r.json()["scores"] == [] and r.json()["object"] == "scoring"


def test_response_store_bound_and_expiry() -> None:
    store = ResponseStore(max_entries=2, ttl_s=0.2)
    for i in range(3):
        store.put({"id": f"resp_{i}"}, [])
    assert store.get("resp_0") is None and len(store) == 2  # the oldest went first
    time.sleep(0.25)
    assert store.get("resp_2") is None and len(store) == 0  # expired
