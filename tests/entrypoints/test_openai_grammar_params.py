"""Constrained decoding through the OpenAI routes, against the fake runtime: which
grammar sampling parameter each `response_format` and extra field becomes, and
every 400 (in the OpenAI error body) for a bad or doubled constraint.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from _fake_runtime import FakeTokenizerManager, byte_tokenizer, fake_starter
from starlette.testclient import TestClient

from radixlm.entrypoints.http.server import create_app
from radixlm.messages.generate_output import GenerateOutput
from radixlm.messages.io_struct import FinishReason
from radixlm.messages.sampling_params import GRAMMAR_PARAMS, TOO_MANY_GRAMMARS
from radixlm.server_args import ServerArgs
from radixlm.tokenizer.request_input import GenerateReqInput

ROUTES = {"chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
          "completions": ("/v1/completions", {"prompt": "hi"})}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
STRUCTURES = [{"begin": "<function=weather>", "schema": SCHEMA, "end": "</function>"}]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return byte_tokenizer()


def _client(tm: FakeTokenizerManager) -> TestClient:
    app = create_app(ServerArgs(served_model_name="fake-model"), fake_starter(tm))
    return TestClient(app, raise_server_exceptions=False,
                      base_url="http://localhost")


@pytest.fixture
def tm(tokenizer: Any) -> FakeTokenizerManager:
    return FakeTokenizerManager(tokenizer)


@pytest.fixture
def client(tm: FakeTokenizerManager) -> Iterator[TestClient]:
    with _client(tm) as c:
        assert c.get("/health").status_code == 200
        yield c


def _post(client: TestClient, route: str, stream: bool = False, **fields: Any) -> Any:
    path, body = ROUTES[route]
    return client.post(path, json={**body, "max_tokens": 4, "stream": stream, **fields})


def _grammar_sent(tm: FakeTokenizerManager) -> dict[str, Any]:
    """The grammar sampling parameters of the last request the runtime received."""
    params = tm.received[-1].sampling_params
    assert isinstance(params, dict)
    return {k: params[k] for k in GRAMMAR_PARAMS if params.get(k) is not None}


def _assert_error(resp: Any, *words: str) -> dict[str, Any]:
    assert resp.status_code == 400, resp.text
    body = resp.json()
    assert set(body) == {"object", "message", "type", "param", "code"}
    assert body["object"] == "error" and body["type"] == "BadRequestError"
    assert body["code"] == 400
    for w in words:
        assert w in body["message"], body
    return body


# ---------------------------------------------------------------- mapping


MAPPINGS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("no constraint", {}, {}),
    ("text", {"response_format": {"type": "text"}}, {}),
    ("json_object", {"response_format": {"type": "json_object"}},
     {"json_schema": {"type": "object"}}),
    ("json_schema", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "city", "schema": SCHEMA, "strict": True}}}, {"json_schema": SCHEMA}),
    ("json_schema under schema_", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "city", "schema_": SCHEMA}}}, {"json_schema": SCHEMA}),
    ("structural_tag", {"response_format": {"type": "structural_tag", "structures": STRUCTURES,
                                            "triggers": ["<function="]}},
     {"structural_tag": {"structures": STRUCTURES, "triggers": ["<function="]}}),
    ("regex extra", {"regex": "(yes|no)"}, {"regex": "(yes|no)"}),
    ("ebnf extra", {"ebnf": 'root ::= "a" | "b"'}, {"ebnf": 'root ::= "a" | "b"'}),
    ("json_schema extra, a string", {"json_schema": json.dumps(SCHEMA)},
     {"json_schema": SCHEMA}),
    ("json_schema extra, an object", {"json_schema": SCHEMA}, {"json_schema": SCHEMA}),
]


def _parsed(sent: dict[str, Any]) -> dict[str, Any]:
    return {k: v if k in ("regex", "ebnf") else json.loads(v) for k, v in sent.items()}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("case,fields,expected", MAPPINGS, ids=[m[0] for m in MAPPINGS])
def test_constraint_reaches_the_runtime(client: TestClient, tm: FakeTokenizerManager,
                                        route: str, stream: bool, case: str,
                                        fields: dict[str, Any], expected: dict[str, Any]) -> None:
    r = _post(client, route, stream, **fields)
    assert r.status_code == 200, r.text
    sent = _grammar_sent(tm)
    assert all(isinstance(v, str) for v in sent.values())  # the runtime takes JSON as text
    assert _parsed(sent) == expected


def test_json_object_and_string_schema_are_sent_verbatim(client: TestClient,
                                                         tm: FakeTokenizerManager) -> None:
    _post(client, "chat", response_format={"type": "json_object"})
    assert _grammar_sent(tm) == {"json_schema": '{"type": "object"}'}
    text = '{"type": "string",   "maxLength": 3}'
    _post(client, "completions", json_schema=text)
    assert _grammar_sent(tm) == {"json_schema": text}


# ---------------------------------------------------------------- 400s

ALLOWED_TYPES = ["'text'", "'json_object'", "'json_schema'", "'structural_tag'"]
BAD: list[tuple[str, dict[str, Any], list[str]]] = [
    ("unknown type", {"response_format": {"type": "xml"}}, ["response_format.type"]
     + ALLOWED_TYPES),
    ("no type", {"response_format": {}}, ["response_format.type"]),
    ("json_schema without json_schema", {"response_format": {"type": "json_schema"}},
     ["response_format", '"json_schema"', '"schema"']),
    ("json_schema without schema", {"response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "strict": True}}},
     ["response_format", '"json_schema"', '"schema"']),
    ("json_schema with a non-object schema", {"response_format": {
        "type": "json_schema", "json_schema": {"schema": "object"}}},
     ["response_format.json_schema.schema"]),
    ("structural_tag without triggers", {"response_format": {
        "type": "structural_tag", "structures": STRUCTURES}}, ['"structures" and "triggers"']),
    ("structure without schema", {"response_format": {
        "type": "structural_tag", "structures": [{"begin": "<a>", "end": "</a>"}],
        "triggers": ["<a"]}}, ["response_format.structures.0.schema"]),
    ("json_object and regex", {"response_format": {"type": "json_object"}, "regex": "a"},
     [TOO_MANY_GRAMMARS]),
    ("json_schema format and json_schema extra", {"response_format": {
        "type": "json_schema", "json_schema": {"schema": SCHEMA}}, "json_schema": SCHEMA},
     [TOO_MANY_GRAMMARS]),
    ("structural_tag and ebnf", {"response_format": {
        "type": "structural_tag", "structures": STRUCTURES, "triggers": ["<f"]},
        "ebnf": 'root ::= "a"'}, [TOO_MANY_GRAMMARS]),
    ("regex and ebnf", {"regex": "a", "ebnf": 'root ::= "a"'}, [TOO_MANY_GRAMMARS]),
    ("regex and json_schema", {"regex": "a", "json_schema": "{}"}, [TOO_MANY_GRAMMARS]),
    ("regex not a string", {"regex": 5}, ["regex"]),
    ("json_schema a list", {"json_schema": [1]}, ["json_schema"]),
]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("case,fields,words", BAD, ids=[b[0] for b in BAD])
def test_bad_constraint_is_400(client: TestClient, tm: FakeTokenizerManager, route: str,
                               stream: bool, case: str, fields: dict[str, Any],
                               words: list[str]) -> None:
    body = _assert_error(_post(client, route, stream, **fields), *words)
    if TOO_MANY_GRAMMARS in words:
        assert body["message"] == TOO_MANY_GRAMMARS
    assert not tm.received  # refused before reaching the runtime


@pytest.mark.parametrize("backend,fields,words", [
    ("none", {"response_format": {"type": "json_object"}}, ["--grammar-backend none"]),
    ("none", {"regex": "a+"}, ["--grammar-backend none"]),
    ("outlines", {"ebnf": 'root ::= "a"'}, ["outlines", "ebnf"]),
    ("outlines", {"response_format": {"type": "structural_tag", "structures": STRUCTURES,
                                      "triggers": ["<f"]}}, ["outlines", "structural_tag"]),
])
@pytest.mark.parametrize("route", list(ROUTES))
def test_grammar_the_backend_cannot_serve_is_400(tokenizer: Any, route: str, backend: str,
                                                 fields: dict[str, Any],
                                                 words: list[str]) -> None:
    with _client(FakeTokenizerManager(tokenizer, grammar_backend=backend)) as c:
        assert c.get("/health").status_code == 200
        for stream in (False, True):
            _assert_error(_post(c, route, stream, **fields), *words)
        assert _post(c, route).status_code == 200  # unconstrained requests still work


class _BadGrammarTokenizerManager(FakeTokenizerManager):
    """Ends every request as the scheduler ends one whose grammar does not compile."""

    async def generate(self, obj: GenerateReqInput) -> AsyncIterator[GenerateOutput]:
        self.received.append(obj)
        reason = FinishReason("abort", message="Failed to compile regex grammar: "
                              "unbalanced parenthesis", status_code=400)
        yield GenerateOutput(index=0, rid="x", text="", token_ids=[], prompt_tokens=2,
                             completion_tokens=0, cached_tokens=0, forward_steps=0,
                             jump_forward_tokens=0, finish_reason=reason, created=0.0,
                             first_token_time=None, e2e_latency=0.0)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_grammar_that_fails_to_compile_is_400(tokenizer: Any, route: str,
                                              stream: bool) -> None:
    with _client(_BadGrammarTokenizerManager(tokenizer)) as c:
        assert c.get("/health").status_code == 200
        _assert_error(_post(c, route, stream, regex="(a"),
                      "Failed to compile regex grammar: unbalanced parenthesis")


# ---------------------------------------------------------------- meta_info


def test_extra_meta_info_keys_pass_through(client: TestClient) -> None:
    """The scheduler's per-request counters reach /generate and do not disturb OpenAI usage."""
    meta = client.post("/generate", json={"text": "hi", "sampling_params": {
        "max_new_tokens": 3, "regex": "[a-z]+"}}).json()["meta_info"]
    assert meta["forward_steps"] == 3 and meta["jump_forward_tokens"] == 0
    for route in ROUTES:
        body = _post(client, route, response_format={"type": "json_object"}).json()
        assert body["usage"]["completion_tokens"] == 4
        assert "forward_steps" not in json.dumps(body)
