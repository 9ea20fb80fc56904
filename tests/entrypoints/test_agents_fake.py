"""Tool calls and reasoning through the HTTP layer, on the fake runtime (no model):
the fake "generates" a recorded model text, so the parsing, the deltas and the
fields the server sends to the runtime can be checked exactly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from _fake_runtime import FakeTokenizerManager, byte_tokenizer, fake_starter
from starlette.testclient import TestClient

from radixlm.entrypoints.http.server import create_app
from radixlm.server_args import ServerArgs

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}}}]
# NOTE: the fake streams one byte per token and decodes each alone, so the recorded text
# stays ASCII (é written as a JSON escape); it ends at the (one-byte) stop string $.
HERMES_REPLY = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
                '{"city": "Paris \\"centre\\" \\u00e9"}}\n</tool_call>$')
THINK_REPLY = "<think>\nTwo and two.\n</think>\n\nThe answer is 4."
USER = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return byte_tokenizer()


def _serve(tokenizer: Any, reply: str, **args: Any) -> Iterator[tuple[TestClient,
                                                                    FakeTokenizerManager]]:
    tm = FakeTokenizerManager(tokenizer, context_length=4096, reply=reply)
    app = create_app(ServerArgs(served_model_name="fake", **args), fake_starter(tm))
    with TestClient(app, raise_server_exceptions=False, base_url="http://localhost") as c:
        for _ in range(1000):
            if c.get("/health").status_code == 200:
                break
        yield c, tm


@pytest.fixture(scope="module")
def hermes(tokenizer: Any) -> Iterator[tuple[TestClient, FakeTokenizerManager]]:
    yield from _serve(tokenizer, HERMES_REPLY, chat_template="hermes")


@pytest.fixture(scope="module")
def thinker(tokenizer: Any) -> Iterator[tuple[TestClient, FakeTokenizerManager]]:
    yield from _serve(tokenizer, THINK_REPLY, reasoning_parser="qwen3")


def _events(resp: Any) -> list[dict[str, Any]]:
    lines = [ln for ln in resp.text.split("\n\n") if ln.strip()]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(ln.split("data: ", 1)[1]) for ln in lines[:-1]]


def _chat(c: TestClient, reply: str, **body: Any) -> Any:
    return c.post("/v1/chat/completions", json={"messages": USER, "temperature": 0, "stop": "$",
                                                "max_tokens": len(reply.encode()), **body})


def test_hermes_auto_call_parsed(hermes: Any) -> None:
    c, tm = hermes
    body = _chat(c, HERMES_REPLY, tools=TOOLS).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me check."
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": 'Paris "centre" é'}
    # The template got the tools; auto is not constrained without the flag.
    sent = tm.received[-1].sampling_params
    assert not any(sent.get(k) for k in ("regex", "json_schema", "ebnf", "structural_tag"))


def test_hermes_stream_deltas_join_and_hide_markup(hermes: Any) -> None:
    c, _ = hermes
    events = _events(_chat(c, HERMES_REPLY, tools=TOOLS, stream=True))
    content, args, firsts = "", "", []
    for e in events:
        delta = e["choices"][0]["delta"]
        content += delta.get("content") or ""
        for call in delta.get("tool_calls") or []:
            if "id" in call:
                firsts.append(call)
            args += call["function"]["arguments"]
    assert content == "Let me check."
    assert "<tool_call>" not in content
    assert len(firsts) == 1 and firsts[0]["function"]["name"] == "get_weather"
    assert firsts[0]["index"] == 0 and firsts[0]["type"] == "function"
    assert json.loads(args) == {"city": 'Paris "centre" é'}
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_required_sends_the_constraint(hermes: Any) -> None:
    c, tm = hermes
    r = _chat(c, HERMES_REPLY, tools=TOOLS, tool_choice="required")
    assert r.status_code == 200, r.text
    sent = tm.received[-1].sampling_params
    assert "structural_tag" in sent and "get_weather" in sent["structural_tag"]
    r = _chat(c, HERMES_REPLY, tools=TOOLS, tool_call_constrained=True)  # auto, triggered
    assert "triggered_tags" in tm.received[-1].sampling_params["structural_tag"]


def test_history_with_tool_calls_renders(hermes: Any) -> None:
    c, tm = hermes
    history = USER + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    r = c.post("/v1/chat/completions", json={"messages": history, "tools": TOOLS,
                                             "max_tokens": 4})
    assert r.status_code == 200, r.text
    prompt = tm.tokenizer.decode(tm.received[-1].input_ids)
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt
    bad = [dict(history[1], tool_calls=[{"id": "c1", "type": "function", "function": {
        "name": "get_weather", "arguments": "{not json"}}])]
    r = c.post("/v1/chat/completions", json={"messages": USER + bad, "tools": TOOLS})
    assert r.status_code == 400 and "arguments is not valid JSON" in r.json()["message"]


def test_reasoning_content_whole_and_streamed(thinker: Any) -> None:
    c, tm = thinker
    msg = _chat(c, THINK_REPLY).json()["choices"][0]["message"]
    assert msg["reasoning_content"] == "Two and two."
    assert msg["content"] == "The answer is 4."
    reasoning, content = "", ""
    for e in _events(_chat(c, THINK_REPLY, stream=True)):
        delta = e["choices"][0]["delta"]
        reasoning += delta.get("reasoning_content") or ""
        content += delta.get("content") or ""
    assert (reasoning, content) == ("Two and two.", "The answer is 4.")
    off = _chat(c, THINK_REPLY, chat_template_kwargs={"enable_thinking": False}).json()
    assert off["choices"][0]["message"]["content"] == THINK_REPLY  # thinking off: no split


def test_grammar_waits_for_the_think_block(thinker: Any) -> None:
    c, tm = thinker
    _chat(c, THINK_REPLY, regex="[0-9]+")
    assert tm.received[-1].sampling_params["reasoning_phase"] == "start"  # qwen3: optional
    r = c.post("/generate", json={"text": "Q: 2+2?<think>\n", "sampling_params": {
        "max_new_tokens": 5, "regex": "[0-9]"}})
    assert r.status_code == 200
    assert tm.received[-1].sampling_params["regex"] == "[0-9]"  # the runtime gates it


def test_generate_separate_reasoning(thinker: Any) -> None:
    c, _ = thinker
    n = len(THINK_REPLY.encode())
    body = c.post("/generate", json={"text": "Q", "separate_reasoning": True,
                                     "sampling_params": {"max_new_tokens": n}}).json()
    assert body["text"] == THINK_REPLY
    assert (body["reasoning_content"], body["content"]) == ("Two and two.", "The answer is 4.")
    r = c.post("/generate", json={"text": "Q", "stream": True, "separate_reasoning": True,
                                  "sampling_params": {"max_new_tokens": n}})
    events = _events(r)
    assert "".join(e["reasoning_content_delta"] for e in events) == "Two and two."
    assert "".join(e["content_delta"] for e in events) == "The answer is 4."


def test_separate_reasoning_needs_a_parser(hermes: Any) -> None:
    c, _ = hermes
    r = c.post("/generate", json={"text": "Q", "separate_reasoning": True})
    assert r.status_code == 400 and "--reasoning-parser" in r.json()["message"]


def test_responses_reasoning_and_text(thinker: Any) -> None:
    c, _ = thinker
    body = c.post("/v1/responses", json={"input": "2+2?", "max_output_tokens": len(
        THINK_REPLY.encode())}).json()
    kinds = [item["type"] for item in body["output"]]
    assert kinds == ["reasoning", "message"]
    assert body["output"][0]["content"][0]["text"] == "Two and two."
    assert body["output"][1]["content"][0]["text"] == "The answer is 4."
    r = c.post("/v1/responses", json={"input": "2+2?", "stream": True,
                                      "max_output_tokens": len(THINK_REPLY.encode())})
    events = _events(r)
    types = [e["type"] for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.incomplete"  # it ran to max_output_tokens
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    thought = "".join(e["delta"] for e in events
                      if e["type"] == "response.reasoning_text.delta")
    assert (thought, text) == ("Two and two.", "The answer is 4.")
