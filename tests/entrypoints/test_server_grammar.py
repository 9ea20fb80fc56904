"""Constrained decoding end to end: the real server on each grammar backend.

xgrammar runs on the session's shared server (the default backend); outlines
and llguidance get a server each, started once for their tests. Every output
is checked against its constraint with `re.fullmatch` or `jsonschema`.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from _server_process import API_KEY, AUTH, ServerProcess

BACKENDS = ["xgrammar", "outlines", "llguidance"]

REGEXES = {
    "email": r"^user@example\.com$",
    "greeting": r"(Hello|Hi|Hey)",
    "digits": r"\d{3}",
    "phone": r"\(\d{3}\) \d{3}-\d{4}",
    "date": r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",
    "colour": r"#[0-9a-fA-F]{6}",
    "log": r"\[(INFO|WARN|ERROR)\] [a-z]{3,8}: [a-z]{1,10}( [a-z]{1,10}){0,3}",
}

CITY_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": r"^[\w]+$", "maxLength": 20},
        "population": {"type": "integer"},
    },
    "required": ["name", "population"],
    "additionalProperties": False,
}

PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer"},
        "email": {"type": "string", "pattern": r"^[a-z]{1,10}@[a-z]{1,10}\.com$"},
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 16},
                   "minItems": 1, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20},
                           "zip": {"type": "string", "pattern": r"^\d{5}$"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "email", "skills", "address"],
    "additionalProperties": False,
}

# NOTE: the 135M default model, greedy, tends to repeat a digit until max_tokens
# inside a JSON number; a mild repetition penalty lets it close the number.
JSON_PENALTY = {"repetition_penalty": 1.2}

GREETING_EBNF = 'root ::= "Hello" | "Hi" | "Hey"'
JSON_EBNF = r"""
root ::= object
object ::= "{" pair ("," pair)* "}"
pair ::= string ":" value
value ::= string | number | "true" | "false"
string ::= "\"" [a-z]+ "\""
number ::= [1-9] [0-9]*
"""


def _strip_anchors(regex: str) -> str:
    return regex.removeprefix("^").removesuffix("$")


@pytest.fixture(scope="module", params=BACKENDS)
def backend_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[tuple[str, ServerProcess]]:
    backend = request.param
    if backend == "xgrammar":  # the default: the session's shared server
        yield backend, request.getfixturevalue("server")
        return
    log = Path(tmp_path_factory.mktemp(backend)) / "server.log"
    srv = ServerProcess(log, "--api-key", API_KEY, "--grammar-backend", backend)
    try:
        srv.wait_healthy()
        yield backend, srv
    finally:
        srv.stop(signal.SIGTERM)


@pytest.fixture(scope="module")
def backend(backend_server: tuple[str, ServerProcess]) -> str:
    return backend_server[0]


@pytest.fixture(scope="module")
def gen(backend_server: tuple[str, ServerProcess]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=backend_server[1].url, headers=AUTH, timeout=300) as c:
        yield c


@pytest.fixture(scope="module")
def client(backend_server: tuple[str, ServerProcess]) -> Any:
    return openai.OpenAI(base_url=backend_server[1].url + "/v1", api_key=API_KEY,
                         max_retries=0, timeout=300)


def _generate(gen: httpx.Client, text: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
    r = gen.post("/generate", json={"text": text, "sampling_params": params})
    assert r.status_code == 200, r.text
    out = r.json()
    return out if isinstance(out, list) else [out]


def test_regexes_n3_temperature_1(gen: httpx.Client) -> None:
    names = list(REGEXES)
    prompts = [f"Write a {name}:" for name in names]
    outs = _generate(gen, prompts, [
        {"regex": REGEXES[name], "n": 3, "temperature": 1.0, "max_new_tokens": 48}
        for name in names
    ])
    assert len(outs) == 3 * len(names)
    for i, out in enumerate(outs):
        regex = _strip_anchors(REGEXES[names[i // 3]])
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        assert re.fullmatch(regex, out["text"]), (regex, out["text"])


@pytest.mark.parametrize("schema", [CITY_SCHEMA, PERSON_SCHEMA], ids=["city", "person"])
def test_json_schema_generate(gen: httpx.Client, schema: dict[str, Any]) -> None:
    prompts = ["Describe Paris as JSON.", "Give an example record as JSON."]
    outs = _generate(gen, prompts, {"json_schema": json.dumps(schema), "temperature": 0,
                                    "max_new_tokens": 160, **JSON_PENALTY})
    for out in outs:
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        jsonschema.validate(json.loads(out["text"]), schema)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_response_format_json_schema(client: Any, stream: bool) -> None:
    fmt = {"type": "json_schema",
           "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True}}
    messages = [{"role": "user", "content": "Invent a software engineer."}]
    if stream:
        chunks = list(client.chat.completions.create(
            model="default", messages=messages, response_format=fmt, temperature=0,
            max_tokens=160, stream=True, extra_body=JSON_PENALTY))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        r = client.chat.completions.create(model="default", messages=messages,
                                           response_format=fmt, temperature=0, max_tokens=160,
                                           extra_body=JSON_PENALTY)
        text, finish = r.choices[0].message.content, r.choices[0].finish_reason
    assert finish == "stop", text
    jsonschema.validate(json.loads(text), PERSON_SCHEMA)


def test_json_object_without_mentioning_json(client: Any) -> None:
    r = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Describe a cat in one line."}],
        response_format={"type": "json_object"}, temperature=0, max_tokens=200,
        extra_body=JSON_PENALTY)
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_completions_extra_body_regex(client: Any) -> None:
    r = client.completions.create(model="default", prompt="The date today is", max_tokens=20,
                                  extra_body={"regex": REGEXES["date"]}, n=2, temperature=1.0)
    for choice in r.choices:
        assert re.fullmatch(REGEXES["date"], choice.text), choice.text


def test_ebnf(gen: httpx.Client, backend: str) -> None:
    if backend == "outlines":
        r = gen.post("/generate", json={"text": "Hi", "sampling_params": {"ebnf": GREETING_EBNF}})
        assert r.status_code == 400
        assert "does not support ebnf" in r.json()["message"]
        return
    outs = _generate(gen, ["Greet me:"], {"ebnf": GREETING_EBNF, "n": 3, "temperature": 1.0,
                                          "max_new_tokens": 8})
    assert all(o["text"] in ("Hello", "Hi", "Hey") for o in outs), outs
    outs = _generate(gen, ["A JSON object:"], {"ebnf": JSON_EBNF, "temperature": 0,
                                               "max_new_tokens": 64, "stop": "\n"})
    text = outs[0]["text"]
    if outs[0]["meta_info"]["finish_reason"]["type"] == "stop":
        assert isinstance(json.loads(text), dict), text
    assert re.match(r'\{"[a-z]+":', text), text


def test_40_concurrent_mixed(gen: httpx.Client) -> None:
    def one(i: int) -> tuple[int, dict[str, Any]]:
        params: dict[str, Any] = {"max_new_tokens": 24, "temperature": 1.0, "seed": i}
        if i % 2 == 0:
            params["regex"] = REGEXES["phone"] if i % 4 == 0 else REGEXES["colour"]
        r = gen.post("/generate", json={"text": f"Item {i}:", "sampling_params": params})
        assert r.status_code == 200, r.text
        return i, r.json()

    with ThreadPoolExecutor(40) as pool:
        results = list(pool.map(one, range(40)))
    assert len(results) == 40
    for i, out in results:
        if i % 2 == 0:
            regex = REGEXES["phone"] if i % 4 == 0 else REGEXES["colour"]
            assert re.fullmatch(regex, out["text"]), (i, out["text"])
        else:
            assert out["meta_info"]["completion_tokens"] > 0


@pytest.mark.parametrize("kind,text,reason", [
    ("regex", "(unclosed", "Failed to compile regex grammar"),
    ("json_schema", "INVALID", "Failed to compile json_schema grammar"),
    ("ebnf", "root ::= (", "Failed to compile ebnf grammar"),
])
def test_invalid_grammar_is_400_and_server_keeps_serving(
    gen: httpx.Client, client: Any, backend: str, kind: str, text: str, reason: str
) -> None:
    r = gen.post("/generate", json={"text": "x", "sampling_params": {kind: text}})
    assert r.status_code == 400, r.text
    expected = "does not support ebnf" if backend == "outlines" and kind == "ebnf" else reason
    assert expected in r.json()["message"]
    # The OpenAI route reports the same failure.
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="default", prompt="x", max_tokens=4,
                                  extra_body={kind: text})
    assert expected in str(e.value)
    # The next valid request works.
    outs = _generate(gen, ["Pick:"], {"regex": "(yes|no)", "max_new_tokens": 4})
    assert outs[0]["text"] in ("yes", "no")


WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                  "required": ["city"], "additionalProperties": False}
WEATHER_TAG = {"structures": [{"begin": "<function=get_weather>", "schema": WEATHER_SCHEMA,
                               "end": "</function>"}], "triggers": ["<function="]}
TOOL_PROMPT = (
    "User: What's the weather in Rome?\n"
    'Assistant: <function=get_weather>{"city": "Rome"}</function>\n'
    "User: What's the weather in Oslo?\n"
    'Assistant: <function=get_weather>{"city": "Oslo"}</function>\n'
    "User: What's the weather in Paris?\nAssistant:"
)


def test_structural_tag(gen: httpx.Client, backend: str) -> None:
    params = {"structural_tag": json.dumps(WEATHER_TAG), "temperature": 0, "max_new_tokens": 40}
    r = gen.post("/generate", json={"text": TOOL_PROMPT, "sampling_params": params})
    if backend == "outlines":
        assert r.status_code == 400
        assert "does not support structural_tag" in r.json()["message"]
        return
    assert r.status_code == 200, r.text
    text = r.json()["text"]
    match = re.search(r"<function=get_weather>(.*?)</function>", text, re.DOTALL)
    assert match is not None, text
    jsonschema.validate(json.loads(match.group(1)), WEATHER_SCHEMA)
