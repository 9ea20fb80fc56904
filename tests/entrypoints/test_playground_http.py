"""API fields the playground reads, on a fake runtime: usage extras (jump-forward
tokens, continuous usage stats) and whether the model takes images.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from _fake_runtime import FakeTokenizerManager, byte_tokenizer, fake_starter
from starlette.testclient import TestClient

from radixlm.entrypoints.http_server import create_app
from radixlm.server_args import ServerArgs

KEY = "sk-playground"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return byte_tokenizer()


@pytest.fixture
def client(tokenizer: Any) -> Iterator[TestClient]:
    args = ServerArgs(served_model_name="fake-model", api_key=KEY)
    app = create_app(args, fake_starter(FakeTokenizerManager(tokenizer)))
    with TestClient(app, raise_server_exceptions=False) as c:
        deadline = time.monotonic() + 10
        while c.get("/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        yield c


def test_model_info_says_whether_images_are_understood(client: TestClient) -> None:
    info = client.get("/get_model_info", headers=AUTH).json()
    assert info["has_image_understanding"] is False
    assert info["has_video_understanding"] is False
    assert info["served_model_name"] == "fake-model"


def _events(text: str) -> list[Any]:
    lines = [ln for ln in text.split("\n\n") if ln.strip()]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(ln.removeprefix("data: ")) for ln in lines[:-1]]


def test_usage_has_jump_forward_tokens(client: TestClient) -> None:
    body = client.post("/v1/chat/completions", headers=AUTH, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).json()
    assert body["usage"]["completion_tokens_details"] == {"jump_forward_tokens": 0}
    body = client.post("/v1/completions", headers=AUTH,
                       json={"prompt": "hi", "max_tokens": 4}).json()
    assert body["usage"]["completion_tokens_details"] == {"jump_forward_tokens": 0}


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_continuous_usage_stats(client: TestClient, route: str) -> None:
    body: dict[str, Any] = {"max_tokens": 5, "stream": True, "stream_options": {
        "include_usage": True, "continuous_usage_stats": True}}
    if route == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    events = _events(client.post(route, headers=AUTH, json=body).text)
    with_choices = [e for e in events if e["choices"]]
    assert all(e["usage"] is not None for e in with_choices)
    counts = [e["usage"]["completion_tokens"] for e in with_choices]
    assert counts == sorted(counts) and counts[-1] == 5
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 5
    # Without continuous_usage_stats only the last chunk has usage (OpenAI's behaviour).
    body["stream_options"] = {"include_usage": True}
    events = _events(client.post(route, headers=AUTH, json=body).text)
    assert [e["usage"] is not None for e in events].count(True) == 1
