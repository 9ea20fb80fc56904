"""Ollama's API through the HTTP layer, on the fake runtime (no model): the objects,
the NDJSON stream, the translated request and the error bodies, exactly."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from _fake_runtime import REPLY, FakeTokenizerManager, byte_tokenizer, serve_fake

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}}}]
HERMES_REPLY = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
                '{"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", '
                '"arguments": {"city": "Rome"}}\n</tool_call>$')
THINK_REPLY = "<think>\nTwo and two.\n</think>\n\nThe answer is 4."
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
REPEAT_REPLY = CALL * 6
USER = [{"role": "user", "content": "Weather in Paris?"}]
DURATIONS = ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration")
Served = tuple[Any, FakeTokenizerManager]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return byte_tokenizer()


@pytest.fixture(scope="module")
def plain(tokenizer: Any) -> Iterator[Served]:
    yield from serve_fake(tokenizer, context_length=512)


@pytest.fixture(scope="module")
def hermes(tokenizer: Any) -> Iterator[Served]:
    yield from serve_fake(tokenizer, HERMES_REPLY, chat_template="hermes")


@pytest.fixture(scope="module")
def thinker(tokenizer: Any) -> Iterator[Served]:
    yield from serve_fake(tokenizer, THINK_REPLY, reasoning_parser="qwen3")


def _chat(c: Any, n: int, **body: Any) -> Any:
    options = {"num_predict": n, **body.pop("options", {})}
    return c.post("/api/chat", json={"model": "m", "messages": USER, "options": options,
                                     **body})


def _lines(r: Any) -> list[dict[str, Any]]:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in r.text.splitlines()]


def _error(r: Any, status: int, *words: str) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert list(body) == ["error"] and isinstance(body["error"], str), body
    for w in words:
        assert w in body["error"], (w, body)
    return str(body["error"])


def _check_final(last: dict[str, Any], n: int, reason: str) -> None:
    assert last["done"] is True and last["done_reason"] == reason
    assert last["eval_count"] == n and last["prompt_eval_count"] > 0
    assert all(isinstance(last[k], int) for k in DURATIONS)
    assert last["total_duration"] >= last["prompt_eval_duration"] + last["eval_duration"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z", last["created_at"])


def test_chat_streams_ndjson_by_default(plain: Served) -> None:
    c, _ = plain
    lines = _lines(_chat(c, 8))
    assert all(line["model"] == "m" for line in lines)
    assert all(not line["done"] for line in lines[:-1])
    assert "".join(line["message"]["content"] for line in lines) == REPLY[:8]
    assert all(line["message"]["role"] == "assistant" for line in lines)
    _check_final(lines[-1], 8, "length")


def test_chat_whole(plain: Served) -> None:
    c, _ = plain
    body = _chat(c, 8, stream=False).json()
    assert body["message"] == {"role": "assistant", "content": REPLY[:8]}
    _check_final(body, 8, "length")
    assert _chat(c, 100, stream=False, options={"stop": ["w"]}).json()["done_reason"] == "stop"


def test_options_and_format_reach_the_runtime(plain: Served) -> None:
    c, tm = plain
    options = {"temperature": 0.3, "top_p": 0.8, "top_k": 0, "min_p": 0.1, "seed": 7,
               "repeat_penalty": 1.2, "presence_penalty": 0.5, "frequency_penalty": 0.25,
               "stop": ["\n"], "num_thread": 8, "num_gpu": 99, "use_mmap": True,
               "repeat_last_n": 64, "typical_p": 1.0, "mirostat": 0}
    assert _chat(c, 3, options=options, stream=False).status_code == 200
    sent = tm.received[-1].sampling_params
    assert sent["max_new_tokens"] == 3
    assert (sent["temperature"], sent["top_p"], sent["top_k"], sent["min_p"]) == (
        0.3, 0.8, -1, 0.1)
    assert (sent["seed"], sent["repetition_penalty"]) == (7, 1.2)
    assert (sent["presence_penalty"], sent["frequency_penalty"]) == (0.5, 0.25)
    assert "\n" in sent["stop"]
    _chat(c, 3, options={"seed": -1, "num_predict": -1}, stream=False)
    sent = tm.received[-1].sampling_params
    assert sent["seed"] is None and sent["max_new_tokens"] is None
    _chat(c, 3, format="json", stream=False)
    assert json.loads(tm.received[-1].sampling_params["json_schema"]) == {"type": "object"}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    _chat(c, 3, format=schema, stream=False)
    assert json.loads(tm.received[-1].sampling_params["json_schema"]) == schema


def test_num_ctx_is_checked(plain: Served) -> None:
    c, tm = plain
    _error(_chat(c, 3, options={"num_ctx": 513}), 400, "num_ctx", "512")
    _error(_chat(c, 3, options={"num_ctx": 8}), 400, "num_ctx", "does not fit")
    r = _chat(c, -1, options={"num_ctx": 200}, stream=False)
    assert r.status_code == 200, r.text
    prompt = len(tm.received[-1].input_ids)
    assert tm.received[-1].sampling_params["max_new_tokens"] == 200 - prompt
    _chat(c, 5, options={"num_ctx": 200}, stream=False)
    assert tm.received[-1].sampling_params["max_new_tokens"] == 5


def test_thinking(thinker: Served) -> None:
    c, tm = thinker
    n = len(THINK_REPLY.encode())
    body = _chat(c, n, stream=False, think=True).json()
    assert body["message"]["thinking"] == "Two and two."
    assert body["message"]["content"] == "The answer is 4."
    lines = _lines(_chat(c, n, think=True))
    thought = "".join(line["message"].get("thinking", "") for line in lines)
    text = "".join(line["message"]["content"] for line in lines)
    assert (thought, text) == ("Two and two.", "The answer is 4.")
    off = _chat(c, n, stream=False, think=False).json()
    assert off["message"] == {"role": "assistant", "content": THINK_REPLY}
    gen = c.post("/api/generate", json={"model": "m", "prompt": "2+2?", "stream": False,
                                        "think": "high", "options": {"num_predict": n}})
    assert (gen.json()["thinking"], gen.json()["response"]) == ("Two and two.",
                                                                "The answer is 4.")


def test_think_needs_a_reasoning_parser(plain: Served) -> None:
    c, _ = plain
    _error(_chat(c, 3, think=True), 400, "does not support thinking")
    assert _chat(c, 3, think=False, stream=False).status_code == 200


def test_tool_calls_whole_and_streamed(hermes: Served) -> None:
    c, _ = hermes
    n = len(HERMES_REPLY.encode())
    body = _chat(c, n, tools=TOOLS, stream=False, options={"stop": ["$"]}).json()
    msg = body["message"]
    assert msg["content"] == "Let me check."
    assert [call["function"]["arguments"] for call in msg["tool_calls"]] == [
        {"city": "Paris"}, {"city": "Rome"}]
    assert [call["function"]["index"] for call in msg["tool_calls"]] == [0, 1]
    assert all(call["function"]["name"] == "get_weather" for call in msg["tool_calls"])
    assert body["done_reason"] == "stop"
    lines = _lines(_chat(c, n, tools=TOOLS, options={"stop": ["$"]}))
    calls = [call for line in lines for call in line["message"].get("tool_calls", [])]
    assert [call["function"]["arguments"] for call in calls] == [{"city": "Paris"},
                                                                  {"city": "Rome"}]
    # A call cut by num_predict is not sent (its arguments are not an object).
    cut = _chat(c, n - 17, tools=TOOLS, stream=False).json()["message"]  # {"city": "Ro
    assert [call["function"]["arguments"] for call in cut.get("tool_calls", [])] == [
        {"city": "Paris"}]


def test_tool_history_translates(hermes: Served) -> None:
    c, tm = hermes
    messages = USER + [
        {"role": "assistant", "content": "", "thinking": "hmm", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"function": {"name": "other", "arguments": {}}}]},
        {"role": "tool", "content": "other result", "tool_name": "other"},
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"}]
    r = c.post("/api/chat", json={"model": "m", "messages": messages, "tools": TOOLS,
                                  "stream": False, "options": {"num_predict": 2}})
    assert r.status_code == 200, r.text
    prompt = tm.tokenizer.decode(tm.received[-1].input_ids)
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt


def test_generate(plain: Served) -> None:
    c, tm = plain
    body = c.post("/api/generate", json={"model": "m", "prompt": "Hi", "system": "Be kind.",
                                         "stream": False, "options": {"num_predict": 5}}).json()
    assert body["response"] == REPLY[:5]
    _check_final(body, 5, "length")
    prompt = tm.tokenizer.decode(tm.received[-1].input_ids)
    assert "<|im_start|>system\nBe kind." in prompt and "<|im_start|>user\nHi" in prompt
    context = body["context"]
    assert context == list(tm.received[-1].input_ids) + tm.tokenizer.encode(REPLY[:5])
    again = c.post("/api/generate", json={"model": "m", "prompt": "More", "context": context,
                                          "stream": False, "options": {"num_predict": 2}})
    assert again.status_code == 200
    assert tm.received[-1].input_ids[: len(context)] == context
    raw = c.post("/api/generate", json={"model": "m", "prompt": "Once upon", "raw": True,
                                        "options": {"num_predict": 4}})
    lines = _lines(raw)
    assert "".join(line["response"] for line in lines) == REPLY[:4]
    assert "context" not in lines[-1]
    assert tm.tokenizer.decode(tm.received[-1].input_ids) == "Once upon"


def test_empty_requests_load_the_model(plain: Served) -> None:
    c, _ = plain
    body = c.post("/api/chat", json={"model": "m", "messages": []}).json()
    assert body["done"] and body["done_reason"] == "load"
    assert body["message"] == {"role": "assistant", "content": ""}
    body = c.post("/api/generate", json={"model": "m", "keep_alive": 0}).json()
    assert body["done_reason"] == "unload" and body["response"] == ""


def test_model_routes(plain: Served) -> None:
    c, _ = plain
    [model] = c.get("/api/tags").json()["models"]
    assert model["name"] == model["model"] == "fake:latest"
    assert set(model) >= {"modified_at", "size", "digest", "details"}
    [loaded] = c.get("/api/ps").json()["models"]
    assert loaded["context_length"] == 512 and loaded["name"] == "fake:latest"
    assert re.fullmatch(r"\d+\.\d+\.\d+", c.get("/api/version").json()["version"])
    for name in ("fake", "fake:latest"):
        show = c.post("/api/show", json={"model": name}).json()
        assert show["capabilities"] == ["completion", "tools"]
        assert show["model_info"]["fake.context_length"] == 512
        assert "add_generation_prompt" in show["template"]  # the chat template's text
    _error(c.post("/api/show", json={"model": "other"}), 404, "not found")
    _error(c.post("/api/show", json={}), 400, "model")
    _error(c.post("/api/embed", json={"model": "m", "input": "x"}), 400, "embedding")


@pytest.mark.parametrize("route,body,words", [
    ("/api/chat", {"messages": USER}, ["model"]),
    ("/api/chat", {"model": "m", "messages": [{"role": "robot", "content": "x"}]}, ["role"]),
    ("/api/chat", {"model": "m", "messages": USER, "options": {"temperature": "hot"}},
     ["temperature"]),
    ("/api/chat", {"model": "m", "messages": USER, "options": {"num_predict": 0}},
     ["num_predict"]),
    ("/api/chat", {"model": "m", "messages": USER, "options": {"mirostat": 2}},
     ["mirostat"]),
    ("/api/chat", {"model": "m", "messages": USER, "options": {"typical_p": 0.5}},
     ["typical_p"]),
    ("/api/chat", {"model": "m", "messages": USER, "format": "yaml"}, ["format"]),
    ("/api/chat", {"model": "m", "messages": USER, "stream": "no"}, ["stream"]),
    ("/api/chat", {"model": "m", "messages": USER, "tools": [{"type": "function"}]},
     ["tools"]),
    ("/api/generate", {"model": "m", "prompt": "x", "suffix": "y"}, ["suffix"]),
    ("/api/generate", {"model": "m", "prompt": "x", "template": "{{ .Prompt }}"},
     ["template"]),
    ("/api/generate", {"model": "m", "prompt": "x", "raw": True, "system": "s"}, ["raw"]),
    ("/api/generate", {"model": "m", "prompt": "x", "context": [10**9]}, ["vocabulary"]),
])
def test_bad_requests_are_ollama_errors(plain: Served, route: str, body: dict[str, Any],
                                        words: list[str]) -> None:
    c, _ = plain
    _error(c.post(route, json=body), 400, *words)


def test_other_errors_are_ollama_errors(plain: Served) -> None:
    c, _ = plain
    _error(c.post("/api/chat", content=b"{", headers={"content-type": "application/json"}),
           400, "JSON")
    _error(c.post("/api/pull", json={"model": "m"}), 404)
    _error(c.get("/api/chat"), 405)


def test_an_unexpected_failure_is_a_500_in_each_shape(tokenizer: Any) -> None:
    for c, tm in serve_fake(tokenizer):
        def broken(obj: Any) -> Any:
            raise RuntimeError("bug")

        tm.generate = broken  # type: ignore[method-assign]
        r = c.post("/api/chat", json={"model": "m", "messages": USER})
        assert r.status_code == 500 and r.json() == {"error": "Internal server error: "
                                                              "RuntimeError"}
        r = c.post("/v1/messages", json={"model": "m", "max_tokens": 2, "messages": USER})
        assert r.status_code == 500
        assert r.json()["error"] == {"type": "api_error",
                                     "message": "Internal server error: RuntimeError"}
        r = c.post("/v1/chat/completions", json={"messages": USER})
        assert r.status_code == 500 and r.json()["object"] == "error"


def test_a_repeated_call_ends_the_answer(tokenizer: Any) -> None:
    n = len(REPEAT_REPLY.encode())
    for c, _ in serve_fake(tokenizer, REPEAT_REPLY, chat_template="hermes"):
        body = _chat(c, n, tools=TOOLS, stream=False).json()
        assert [call["function"]["arguments"] for call in body["message"]["tool_calls"]] == [
            {"city": "Paris"}]
        assert body["done_reason"] == "stop" and body["eval_count"] < n
        lines = _lines(_chat(c, n, tools=TOOLS))
        calls = [call for line in lines for call in line["message"].get("tool_calls", [])]
        assert len(calls) == 1 and lines[-1]["done"] and lines[-1]["done_reason"] == "stop"
