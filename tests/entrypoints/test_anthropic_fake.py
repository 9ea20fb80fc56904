"""Anthropic's Messages API through the HTTP layer, on the fake runtime (no model): the
fake "generates" a recorded text, so the blocks, the events, the translated request
and the error bodies can be checked exactly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from _fake_runtime import REPLY, FakeTokenizerManager, byte_tokenizer, serve_fake

from radixlm.entrypoints.openai.protocol import ChatCompletionRequest

TOOLS = [{"name": "get_weather", "description": "The weather of a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}]
HERMES_REPLY = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
                '{"city": "Paris"}}\n</tool_call>$')
THINK_REPLY = "<think>\nTwo and two.\n</think>\n\nThe answer is 4."
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
REPEAT_REPLY = CALL * 6
USER = [{"role": "user", "content": "Weather in Paris?"}]
Served = tuple[Any, FakeTokenizerManager]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return byte_tokenizer()


@pytest.fixture(scope="module")
def plain(tokenizer: Any) -> Iterator[Served]:
    yield from serve_fake(tokenizer)


@pytest.fixture(scope="module")
def hermes(tokenizer: Any) -> Iterator[Served]:
    yield from serve_fake(tokenizer, HERMES_REPLY, chat_template="hermes")


@pytest.fixture(scope="module")
def repeater(tokenizer: Any) -> Iterator[Served]:
    yield from serve_fake(tokenizer, REPEAT_REPLY, chat_template="hermes")


@pytest.fixture(scope="module")
def thinker(tokenizer: Any) -> Iterator[Served]:
    yield from serve_fake(tokenizer, THINK_REPLY, reasoning_parser="qwen3")


def _create(c: Any, reply: str = REPLY, **body: Any) -> Any:
    body = {"model": "claude-x", "max_tokens": len(reply.encode()), "messages": USER,
            **body}
    return c.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})


def _events(r: Any) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of a stream; the name must match the data's type."""
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    out = []
    for block in r.text.split("\n\n"):
        if not block.strip():
            continue
        name_line, data_line = block.split("\n")
        name, data = name_line.removeprefix("event: "), json.loads(data_line[6:])
        assert data["type"] == name
        out.append((name, data))
    return out


def _error(r: Any, status: int, err_type: str, *words: str) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == err_type, body
    assert set(body) == {"type", "error"} and set(body["error"]) == {"type", "message"}
    for w in words:
        assert w in body["error"]["message"], (w, body)
    return str(body["error"]["message"])


def test_text_message(plain: Served) -> None:
    c, tm = plain
    body = _create(c, max_tokens=5, metadata={"user_id": "u1"}).json()
    assert body["id"].startswith("msg_") and body["type"] == "message"
    assert body["role"] == "assistant" and body["model"] == "claude-x"
    assert body["content"] == [{"type": "text", "text": REPLY[:5]}]
    assert (body["stop_reason"], body["stop_sequence"]) == ("max_tokens", None)
    usage = body["usage"]
    assert usage["output_tokens"] == 5
    prompt = len(tm.received[-1].input_ids)
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == prompt


def test_stop_sequence_and_sampling_fields(plain: Served) -> None:
    c, tm = plain
    # (the fake trims a stop string inside one token: one byte)
    body = _create(c, stop_sequences=["w", "zzz"], temperature=0.5, top_p=0.9,
                   top_k=7).json()
    assert body["content"][0]["text"] == "Hello "
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", "w")
    sent = tm.received[-1].sampling_params
    assert (sent["temperature"], sent["top_p"], sent["top_k"]) == (0.5, 0.9, 7)
    assert {"w", "zzz"} <= set(sent["stop"])
    body = _create(c, max_tokens=100).json()  # the reply ends on the template's stop
    assert body["stop_reason"] in ("end_turn", "max_tokens")


def test_stream_events(plain: Served) -> None:
    c, _ = plain
    events = _events(_create(c, max_tokens=8, stream=True))
    names = [n for n, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text == REPLY[:8]
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 8


def test_thinking_blocks(thinker: Served) -> None:
    c, tm = thinker
    body = _create(c, THINK_REPLY).json()
    assert [b["type"] for b in body["content"]] == ["thinking", "text"]
    assert body["content"][0]["thinking"] == "Two and two."
    assert body["content"][1]["text"] == "The answer is 4."
    events = _events(_create(c, THINK_REPLY, stream=True))
    starts = [d["content_block"]["type"] for n, d in events if n == "content_block_start"]
    assert starts == ["thinking", "text"]
    deltas = [d for n, d in events if n == "content_block_delta"]
    thought = "".join(d["delta"]["thinking"] for d in deltas if d["index"] == 0)
    text = "".join(d["delta"]["text"] for d in deltas if d["index"] == 1)
    assert (thought, text) == ("Two and two.", "The answer is 4.")
    omitted = _create(c, THINK_REPLY, thinking={"type": "enabled", "budget_tokens": 64,
                                                "display": "omitted"}).json()
    assert omitted["content"][0] == {"type": "thinking", "thinking": "", "signature": ""}
    off = _create(c, THINK_REPLY, thinking={"type": "disabled"}).json()
    assert off["content"] == [{"type": "text", "text": THINK_REPLY}]


def test_tool_use_whole_and_streamed(hermes: Served) -> None:
    c, _ = hermes
    body = _create(c, HERMES_REPLY, tools=TOOLS, stop_sequences=["$"]).json()
    text, call = body["content"]
    assert text == {"type": "text", "text": "Let me check."}
    assert call["type"] == "tool_use" and call["name"] == "get_weather"
    assert call["input"] == {"city": "Paris"} and call["id"]
    assert body["stop_reason"] == "tool_use"
    events = _events(_create(c, HERMES_REPLY, tools=TOOLS, stop_sequences=["$"],
                             stream=True))
    starts = [d for n, d in events if n == "content_block_start"]
    assert [s["content_block"]["type"] for s in starts] == ["text", "tool_use"]
    assert [s["index"] for s in starts] == [0, 1]
    assert starts[1]["content_block"]["input"] == {}
    parts = [d["delta"]["partial_json"] for n, d in events
             if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta"]
    assert json.loads("".join(parts)) == {"city": "Paris"}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_tool_choice_becomes_the_grammar(hermes: Served) -> None:
    c, tm = hermes
    for choice, word in [({"type": "any"}, "get_weather"),
                         ({"type": "tool", "name": "get_weather"}, "get_weather")]:
        assert _create(c, HERMES_REPLY, tools=TOOLS, tool_choice=choice).status_code == 200
        assert word in tm.received[-1].sampling_params["structural_tag"]
    _create(c, HERMES_REPLY, tools=TOOLS, tool_choice={"type": "none"})
    assert "structural_tag" not in tm.received[-1].sampling_params
    _error(_create(c, tools=TOOLS, tool_choice={"type": "tool", "name": "nope"}), 400,
           "invalid_request_error", "nope")


def test_history_translates_to_the_template(hermes: Served) -> None:
    c, tm = hermes
    messages = USER + [
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "s"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
             "content": [{"type": "text", "text": "boom"}]},
            {"type": "text", "text": "Try again."}]}]
    system = [{"type": "text", "text": "You are terse."}]
    r = _create(c, tools=TOOLS, messages=messages, system=system, max_tokens=4)
    assert r.status_code == 200, r.text
    prompt = tm.tokenizer.decode(tm.received[-1].input_ids)
    assert "You are terse." in prompt
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
    assert "<tool_response>\nError: boom\n</tool_response>" in prompt
    assert prompt.index("Error: boom") < prompt.index("Try again.")


def test_a_final_assistant_message_is_continued(plain: Served) -> None:
    c, tm = plain
    messages = USER + [{"role": "assistant", "content": "The weather is"}]
    assert _create(c, messages=messages, max_tokens=3).status_code == 200
    assert tm.tokenizer.decode(tm.received[-1].input_ids).endswith("The weather is")


def test_count_tokens_matches_the_prompt(plain: Served) -> None:
    c, tm = plain
    r = c.post("/v1/messages/count_tokens", json={"model": "m", "messages": USER,
                                                   "system": "Be brief."})
    assert r.status_code == 200, r.text
    _create(c, system="Be brief.", max_tokens=2)
    assert r.json() == {"input_tokens": len(tm.received[-1].input_ids)}


def test_max_tokens_past_the_context_is_capped(plain: Served) -> None:
    c, tm = plain
    r = _create(c, max_tokens=32000, stop_sequences=["."])
    assert r.status_code == 200, r.text
    assert tm.received[-1].sampling_params["max_new_tokens"] is None  # to the context's end


@pytest.mark.parametrize("body,words", [
    ({"messages": USER}, ["max_tokens"]),
    ({"max_tokens": 0}, ["max_tokens"]),
    ({"max_tokens": 4, "messages": []}, ["messages"]),
    ({"max_tokens": 4, "temperature": 1.5}, ["temperature"]),
    ({"max_tokens": 4, "top_k": 0}, ["top_k"]),
    ({"max_tokens": 4, "stream": "yes"}, ["stream"]),
    ({"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}, ["role"]),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {}}]}]}, ["document"]),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}, ["tool_use"]),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "AAAA"}}]}]}, ["image"]),
    ({"max_tokens": 4, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     ["tools"]),
    ({"max_tokens": 4, "tool_choice": {"type": "tool"}}, ["name"]),
    ({"max_tokens": 4, "thinking": {"type": "enabled"}}, ["budget_tokens"]),
])
def test_bad_requests_are_anthropic_errors(plain: Served, body: dict[str, Any],
                                           words: list[str]) -> None:
    c, _ = plain
    _error(c.post("/v1/messages", json={"model": "m", "messages": USER, **body}), 400,
           "invalid_request_error", *words)


def test_other_errors_are_anthropic_errors(plain: Served) -> None:
    c, _ = plain
    _error(c.post("/v1/messages", content=b"{not json",
                  headers={"content-type": "application/json"}), 400,
           "invalid_request_error", "JSON")
    r = c.post("/v1/messages", json={"model": "m", "max_tokens": 2, "messages": USER},
               headers={"anthropic-version": "latest"})
    _error(r, 400, "invalid_request_error", "anthropic-version")
    _error(c.get("/v1/messages"), 405, "invalid_request_error")
    _error(c.post("/v1/messages/batches", json={}), 404, "not_found_error")
    r = c.post("/v1/chat/completions", json={"messages": []})  # other routes: OpenAI's
    assert r.status_code == 400 and r.json()["object"] == "error"


def test_x_api_key(tokenizer: Any) -> None:
    for c, _ in serve_fake(tokenizer, api_key="sk-test"):
        body = {"model": "m", "max_tokens": 2, "messages": USER}
        assert c.post("/v1/messages", json=body,
                      headers={"x-api-key": "sk-test"}).status_code == 200
        assert c.post("/v1/messages", json=body,
                      headers={"Authorization": "Bearer sk-test"}).status_code == 200
        _error(c.post("/v1/messages", json=body, headers={"x-api-key": "bad"}), 401,
               "authentication_error", "Invalid")
        _error(c.post("/v1/messages", json=body), 401, "authentication_error", "x-api-key")
        r = c.get("/v1/models", headers={"x-api-key": "sk-test"})  # any route takes it
        assert r.status_code == 200


@pytest.mark.skipif("thinking_token_budget" not in ChatCompletionRequest.model_fields,
                    reason="the native thinking_token_budget is not in this tree yet")
def test_thinking_budget_reaches_the_runtime(thinker: Served) -> None:
    c, tm = thinker
    body = {"type": "enabled", "budget_tokens": 5}
    assert _create(c, THINK_REPLY, thinking=body).status_code == 200
    assert tm.received[-1].sampling_params["thinking_token_budget"] == 5


def test_thinking_without_a_reasoning_parser_is_no_error(plain: Served) -> None:
    c, tm = plain
    r = _create(c, max_tokens=4, thinking={"type": "enabled", "budget_tokens": 64})
    assert r.status_code == 200, r.text
    assert "thinking_token_budget" not in tm.received[-1].sampling_params


def test_a_repeated_call_ends_the_answer(repeater: Served) -> None:
    c, _ = repeater
    n = len(REPEAT_REPLY.encode())
    body = _create(c, REPEAT_REPLY, max_tokens=n, tools=TOOLS).json()
    assert [b["type"] for b in body["content"]] == ["tool_use"]
    assert body["stop_reason"] == "tool_use" and body["usage"]["output_tokens"] < n
    events = _events(_create(c, REPEAT_REPLY, max_tokens=n, tools=TOOLS, stream=True))
    starts = [d["content_block"]["type"] for e, d in events if e == "content_block_start"]
    assert starts == ["tool_use"]
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
