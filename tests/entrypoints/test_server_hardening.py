"""Hostile clients against the real server (issue 9): each finding of the probe as a
regression test, then a fuzz test (kill -9 of the server: test_server_lifecycle.py).

One server on a tiny LLaVA-1.5 checkpoint (a vision model, so image URLs are
fetched; its byte-level tokenizer makes a prompt of N bytes N tokens) serves the
module with default security flags, `--watchdog-timeout 3` and a context of 64
tokens (so that any generation the fuzzer asks for is short). After every bad
request the server must answer a normal one (`_alive`).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from _fuzz import body_strategy, bound_cost, sampling_params_strategy
from _media_server import MediaServer
from _server_process import ServerProcess
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "multimodal"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "models"))
from _tiny_llava import png_bytes  # noqa: E402
from _tiny_llava_checkpoint import build_checkpoint  # noqa: E402

from radixlm.entrypoints.anthropic.protocol import (  # noqa: E402
    CountTokensRequest,
    MessagesRequest,
)
from radixlm.entrypoints.native.api import AbortRequest, GenerateRequest  # noqa: E402
from radixlm.entrypoints.ollama import protocol as ollama  # noqa: E402
from radixlm.entrypoints.openai.protocol import (  # noqa: E402
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)

WATCHDOG = 3.0  # --watchdog-timeout of the module's server
PROMPT = "USER: Hi\nASSISTANT:"
CHAT = [{"role": "user", "content": "Hi"}]
SHORT = {"max_new_tokens": 2}  # the native default (128) is past the context (64)


class Hardened:
    def __init__(self, srv: ServerProcess, http: httpx.Client) -> None:
        self.srv = srv
        self.http = http


@pytest.fixture(scope="module")
def hard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hardened]:
    root = tmp_path_factory.mktemp("hardening")
    path = build_checkpoint(root / "model", "llava")
    srv = ServerProcess(root / "server.log", "--model-path", str(path),
                        "--watchdog-timeout", str(WATCHDOG), "--context-length", "64",
                        "--media-fetch-timeout", "2")
    try:
        srv.wait_healthy()
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            yield Hardened(srv, http)
    finally:
        srv.stop(signal.SIGKILL, timeout=1)


def _alive(hard: Hardened) -> None:
    """The server answers a normal request normally."""
    r = hard.http.post("/generate", json={
        "text": PROMPT, "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] == 2


def _error(r: httpx.Response, status: int, *words: str) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["object"] == "error" and body["code"] == status, body
    for w in words:
        assert w in body["message"], (w, body)
    return str(body["message"])


HUGE = "<1e400>"  # sent as the JSON number 1e400, which parses to infinity


def _post(hard: Hardened, route: str, body: Any) -> httpx.Response:
    """POST `body` as JSON, with HUGE written as a bare 1e400."""
    raw = json.dumps(body).replace(f'"{HUGE}"', "1e400")
    return hard.http.post(route, content=raw, headers={"Content-Type": "application/json"})


def _routes(sampling: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The three generation routes with the same (OpenAI-named) sampling fields."""
    native = {("max_new_tokens" if k == "max_tokens" else k): v for k, v in sampling.items()}
    native.pop("n", None)
    native["n"] = sampling.get("n", 1)
    return [
        ("/v1/completions", {"prompt": "Hello", "max_tokens": 2, **sampling}),
        ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, **sampling}),
        ("/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 2, **native}}),
    ]


# ---------------------------------------------------------------- 1-4: validation


def test_1_a_seed_past_int64_is_400_not_a_dead_server(hard: Hardened) -> None:
    for route, body in _routes({"seed": 18446744073709551615, "n": 2}):
        _error(hard.http.post(route, json=body), 400, "seed")
        _alive(hard)
    # The largest int64 seed with n samples: sample i uses seed + i, wrapped to 64 bits.
    for route, body in _routes({"seed": 2**63 - 1, "n": 2, "temperature": 1.0}):
        assert hard.http.post(route, json=body).status_code == 200, route


@pytest.mark.parametrize("sampling,field", [
    ({"temperature": 1e308}, "temperature"),
    ({"temperature": "inf"}, "temperature"),
    ({"temperature": 1e308, "regex": "[a-z]+"}, "temperature"),
    ({"repetition_penalty": 1e-300}, "repetition_penalty"),
    ({"top_p": "nan"}, "top_p"),
    ({"presence_penalty": HUGE}, "infinity"),  # refused by the JSON parser
])
def test_2_non_finite_sampling_is_400(hard: Hardened, sampling: dict[str, Any],
                                      field: str) -> None:
    for route, body in _routes(sampling):
        if "regex" in sampling and route == "/generate":
            body["sampling_params"]["regex"] = sampling["regex"]
        _error(_post(hard, route, body), 400, field)
    _alive(hard)


@pytest.mark.parametrize("bias,words", [
    ([1, 2], ["logit_bias", "object"]), ("x", ["logit_bias"]), (5, ["logit_bias"]),
    ({"abc": 1}, ["logit_bias", "token ids"]), ({"5": "inf"}, ["logit_bias"]),
    ({"5": True}, ["logit_bias"]), ({"999999": 1}, ["logit_bias", "vocabulary"]),
])
def test_3_logit_bias_must_map_token_ids_to_finite_numbers(hard: Hardened, bias: Any,
                                                           words: list[str]) -> None:
    r = hard.http.post("/generate", json={"text": "Hello", "sampling_params": {
        "max_new_tokens": 2, "logit_bias": bias}})
    _error(r, 400, *words)
    if isinstance(bias, dict):
        r = hard.http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2,
                                                    "logit_bias": bias})
        _error(r, 400, "logit_bias")
    _alive(hard)


@pytest.mark.parametrize("route,body,field", [
    ("/generate", {"input_ids": [True, 5]}, "input_ids"),
    ("/generate", {"text": "Hi", "stream": "yes"}, "stream"),
    ("/generate", {"text": "Hi", "return_logprob": 1}, "return_logprob"),
    ("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": "2"}}, "max_new_tokens"),
    ("/generate", {"text": "Hi", "sampling_params": {"ignore_eos": "yes"}}, "ignore_eos"),
    ("/generate", {"text": "Hi", "sampling_params": {"temperature": True}}, "temperature"),
    ("/abort_request", {"abort_all": "yes"}, "abort_all"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": "2"}, "max_tokens"),
    ("/v1/completions", {"prompt": "Hi", "stream": "yes"}, "stream"),
    ("/v1/completions", {"prompt": [True, 1]}, "prompt"),
    ("/v1/completions", {"prompt": "Hi", "n": 2.0}, "n"),
    ("/v1/chat/completions", {"messages": CHAT, "logprobs": "true"}, "logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "temperature": "0.5"}, "temperature"),
    ("/v1/tokenize", {"prompt": "Hi", "add_special_tokens": "no"}, "add_special_tokens"),
    ("/v1/detokenize", {"tokens": [1, False]}, "tokens"),
])
def test_4_types_are_not_coerced(hard: Hardened, route: str, body: dict[str, Any],
                                 field: str) -> None:
    _error(hard.http.post(route, json=body), 400, field)
    _alive(hard)


def test_4_limits_are_named(hard: Hardened) -> None:
    for route, body, field in [
        ("/v1/completions", {"prompt": "Hi", "n": 129}, "n"),
        ("/v1/completions", {"prompt": "Hi", "logprobs": 21}, "logprobs"),
        ("/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": 21},
         "top_logprobs"),
        ("/generate", {"text": "Hi", "return_logprob": True, "top_logprobs_num": 10**6,
                       "sampling_params": SHORT}, "top_logprobs_num"),
        ("/generate", {"text": "Hi", "logprob_start_len": -5, "sampling_params": SHORT},
         "logprob_start_len"),
        ("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 10**30}},
         "max_new_tokens"),
    ]:
        _error(hard.http.post(route, json=body), 400, field)
    _alive(hard)


# ---------------------------------------------------------------- 5: no stuck request ids


def test_5_a_failed_batch_leaves_no_request_id_behind(hard: Hardened) -> None:
    sampling = {"max_new_tokens": 2, "ignore_eos": True}
    for body in [
        {"text": ["x", "y"], "rid": ["dup", "dup"], "sampling_params": sampling},
        {"text": ["x", "y"], "rid": "dup", "sampling_params": sampling},  # one rid for both
        {"text": ["x", "y"], "rid": ["dup", "dup-b"],
         "sampling_params": [sampling, {"temperature": -1}]},
    ]:
        _error(hard.http.post("/generate", json=body), 400)
        r = hard.http.post("/generate", json={"text": "x", "rid": "dup", "sampling_params": sampling})
        assert r.status_code == 200, r.text
    # Idle past --watchdog-timeout: nothing is held, so the scheduler is not "stuck".
    time.sleep(WATCHDOG + 0.5)
    assert hard.http.get("/health_generate").status_code == 200
    info = hard.http.get("/get_server_info").json()
    assert info["num_running_reqs"] == info["num_waiting_reqs"] == 0


# ---------------------------------------------------------------- 6: the event loop


def _max_health_latency(hard: Hardened, busy: threading.Thread) -> float:
    worst = 0.0
    while busy.is_alive():
        start = time.monotonic()
        assert hard.http.get("/health", timeout=30).status_code == 200
        worst = max(worst, time.monotonic() - start)
        time.sleep(0.05)
    return worst


def test_6_huge_prompts_neither_block_the_loop_nor_get_tokenized(hard: Hardened) -> None:
    huge = "hello world " * (16 * 1024 * 1024 // 12)  # 16 MiB
    too_long = [  # each refused before it is tokenized or scanned
        ("/generate", {"text": huge}), ("/v1/completions", {"prompt": huge}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": huge}]}),
        ("/generate", {"input_ids": [1] * 2_000_000, "sampling_params": SHORT}),
        ("/v1/completions", {"prompt": [1] * 2_000_000}),
    ]
    # Tokenizing 1 MiB here takes ~2 s, in a worker thread.
    jobs = too_long + [("/v1/tokenize", {"prompt": huge[: 1 << 20]})]
    # Encoded up front: json.dumps in the sender threads would hold this process's
    # GIL for ~0.1-0.25 s a body, delaying the /health probes below as well.
    bodies = [json.dumps(body).encode() for _, body in jobs]
    results: dict[int, tuple[float, httpx.Response]] = {}

    def send(i: int) -> None:
        start = time.monotonic()
        r = httpx.post(hard.srv.url + jobs[i][0], content=bodies[i], timeout=120,
                       headers={"Content-Type": "application/json"})
        results[i] = (time.monotonic() - start, r)

    busy = [threading.Thread(target=send, args=(i,)) for i in range(len(jobs))]
    for t in busy:
        t.start()
    worst = max(_max_health_latency(hard, t) for t in busy)
    for t in busy:
        t.join()
    assert worst < 1.0, f"/health took {worst:.2f} s"
    for i, (route, _) in enumerate(too_long):
        elapsed, r = results[i]
        _error(r, 400, "context length")
        assert elapsed < 10, (route, elapsed)
    assert results[len(too_long)][1].json()["count"] == 1 << 20
    _alive(hard)


# ---------------------------------------------------------------- 8: media URLs (SSRF)


def _image_requests(url: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("/generate", {"text": "USER: <image>\nHi\nASSISTANT:", "image_data": url,
                       "sampling_params": {"max_new_tokens": 2}}),
        ("/v1/chat/completions", {"max_tokens": 2, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Hi"}]}]}),
    ]


def test_8_media_urls_to_private_addresses_are_refused_by_default(hard: Hardened) -> None:
    with MediaServer({"/cat.png": png_bytes()}) as media:
        own = hard.srv.url
        urls = [media.url + "/cat.png", f"http://localhost:{media.port}/cat.png",
                f"http://[::1]:{media.port}/cat.png", own + "/get_server_info",
                own + "/flush_cache", "http://169.254.169.254/latest/meta-data/",
                "http://127.0.0.1:1/closed-port.png", media.url + "/redirect/cat.png"]
        messages = set()
        for url in urls:
            for route, body in _image_requests(url):
                messages.add(_error(hard.http.post(route, json=body), 400, "Could not fetch"))
        assert media.hits == []  # refused before connecting
    assert len(messages) == 1, messages  # one text, whatever the cause: no port scanner
    _alive(hard)


# ---------------------------------------------------------------- 9: cross-site requests


def test_9_cross_site_requests_are_refused_and_curl_still_works(hard: Hardened) -> None:
    url = hard.srv.url
    body = json.dumps({"text": PROMPT, "sampling_params": {"max_new_tokens": 1}})
    plain = {"Content-Type": "text/plain"}  # a "simple" request: no CORS preflight
    for route, data in (("/generate", body), ("/abort_request", '{"abort_all": true}'),
                        ("/flush_cache", "")):
        for headers in ({"Origin": "http://evil.example"}, {"Origin": "null"},
                        {"Origin": f"http://localhost:{hard.srv.port + 1}"},  # same site
                        {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}):
            r = hard.http.post(route, content=data, headers={**plain, **headers})
            _error(r, 403, "refused")
    img = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"}
    for headers in (img, {"Sec-Fetch-Site": "cross-site"}, {"Origin": "http://evil.example"},
                    {**img, "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "iframe"}):
        _error(hard.http.get("/get_server_info", headers=headers), 403)  # an <img src> GET
    # A link from another site to a page: a top-level navigation, which the user sees.
    link = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate",
            "Sec-Fetch-Dest": "document"}
    assert hard.http.get("/", headers=link).status_code == 200
    _error(hard.http.post("/flush_cache", headers=link), 403)  # a form POST is not a link
    # curl -d: a form content type, no Origin. And the server's own page: same origin.
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    for headers in (form, {**form, "Origin": url}, {**form, "Sec-Fetch-Site": "same-origin"},
                    {**form, "Sec-Fetch-Site": "none"}):
        assert hard.http.post("/generate", content=body, headers=headers).status_code == 200
    # State-changing control routes are POST only.
    _error(hard.http.get("/flush_cache"), 405)
    assert hard.http.post("/flush_cache").status_code == 200
    # DNS rebinding: a foreign Host header.
    for host in ("evil.example", f"evil.example:{hard.srv.port}", "10.0.0.1"):
        _error(hard.http.get("/v1/models", headers={"Host": host}), 400, "Host")
    for host in (f"localhost:{hard.srv.port}", f"127.0.0.1:{hard.srv.port}", "127.0.0.1"):
        assert hard.http.get("/v1/models", headers={"Host": host}).status_code == 200
    _alive(hard)


def test_head_health_answers_like_get(hard: Hardened) -> None:
    r = hard.http.head("/health")
    assert r.status_code == 200 and r.content == b""
    assert hard.http.get("/health").status_code == 200


# ---------------------------------------------------------------- 10: leaks in error texts

LEAKS = ("/project/", ".cc:", ".py:", " at 0x", "Traceback", 'File "')


def test_10_error_texts_hold_no_paths_addresses_or_tracebacks(hard: Hardened) -> None:
    not_an_image = base64.b64encode(b"just some text, not an image").decode()
    cases = [
        ("/generate", {"text": "Hi", "sampling_params": {**SHORT, "regex": "(("}},
         "parenthesis"),
        ("/generate", {"text": "Hi", "sampling_params": {**SHORT, "ebnf": "root ::= ("}},
         "grammar"),
        ("/v1/chat/completions", {"messages": CHAT, "regex": "[a-"}, "grammar"),
        ("/generate", {"text": "USER: <image>\nHi\nASSISTANT:", "image_data": not_an_image,
                       "sampling_params": SHORT}, "not a valid image"),
    ]
    for route, body, words in cases:
        message = _error(hard.http.post(route, json=body), 400, words)
        assert not any(leak in message for leak in LEAKS), message
    assert "regex_converter.cc" in hard.srv.log_tail(200_000)  # the detail is in the log
    _alive(hard)


# ---------------------------------------------------------------- fuzzing

FUZZ_CASES = [  # route, request model, examples
    ("/generate", GenerateRequest, 300), ("/v1/completions", CompletionRequest, 200),
    ("/v1/chat/completions", ChatCompletionRequest, 150), ("/v1/tokenize", TokenizeRequest, 80),
    ("/v1/detokenize", DetokenizeRequest, 80), ("/abort_request", AbortRequest, 40),
    ("/v1/messages", MessagesRequest, 120), ("/v1/messages/count_tokens", CountTokensRequest, 40),
    ("/api/chat", ollama.ChatRequest, 120), ("/api/generate", ollama.GenerateRequest, 80),
    ("/api/show", ollama.ShowRequest, 20), ("/api/embed", ollama.EmbedRequest, 20),
]
FUZZ_STATS: Counter[tuple[str, int]] = Counter()
FUZZ_SECONDS: list[float] = []
FUZZ = settings(deadline=None, database=None, derandomize=True, print_blob=True,
                suppress_health_check=list(HealthCheck))


def _fuzz_post(hard: Hardened, route: str, content: bytes) -> None:
    start = time.monotonic()
    r = hard.http.post(route, content=content, timeout=30,
                       headers={"Content-Type": "application/json"})
    elapsed = time.monotonic() - start
    FUZZ_STATS[(route, r.status_code)] += 1
    assert r.status_code < 500, (route, content[:2000], r.text[:2000])
    assert elapsed < 30, (route, content[:2000], elapsed)
    kind = r.headers.get("content-type", "")
    if r.status_code >= 400:
        _check_error_shape(route, r.json())
    elif kind.startswith("text/event-stream"):
        for line in r.text.splitlines():
            if line.startswith("data: {") and '"error"' in line[:12]:
                assert json.loads(line[6:])["error"]["code"] < 500, (route, content, line)
            elif line.startswith('data: {"type":"error"'):  # Anthropic's error event
                assert json.loads(line[6:])["error"]["type"] != "api_error", (route, line)
    elif kind.startswith("application/x-ndjson"):  # Ollama's stream: an error is a line
        for line in r.text.splitlines():
            assert "Internal server error" not in line, (route, content, line)


def _check_error_shape(route: str, body: Any) -> None:
    """Each API's errors in its own shape (OpenAI's elsewhere)."""
    if route.startswith("/v1/messages"):
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    elif route.startswith("/api/"):
        assert list(body) == ["error"] and isinstance(body["error"], str), body
    else:
        assert body["object"] == "error", body


@pytest.mark.parametrize("route,model,num_examples", FUZZ_CASES,
                         ids=[c[0] for c in FUZZ_CASES])
def test_fuzz_bodies(hard: Hardened, route: str, model: Any, num_examples: int) -> None:
    """Bodies drawn from the route's own request model (tests/entrypoints/_fuzz.py):
    never a 5xx, never a hang, and the server serves normally afterwards."""
    start = time.monotonic()

    @settings(FUZZ, max_examples=num_examples)
    @given(body=body_strategy(model.model_json_schema()).map(bound_cost))
    def case(body: Any) -> None:
        _fuzz_post(hard, route, json.dumps(body).encode())  # may hold NaN / Infinity

    case()
    FUZZ_SECONDS.append(time.monotonic() - start)
    _alive(hard)


def test_fuzz_sampling_params(hard: Hardened) -> None:
    """Every body's one anomaly in its sampling parameters, native and OpenAI-named."""
    start = time.monotonic()
    prompts = st.sampled_from([{"text": "Hello"}, {"input_ids": [1, 2, 3]},
                               {"text": ["a", "b"]}, {"text": "USER: Hi\nASSISTANT:"}])

    @settings(FUZZ, max_examples=300)
    @given(prompt=prompts, params=sampling_params_strategy().map(bound_cost),
           stream=st.booleans())
    def native(prompt: dict[str, Any], params: Any, stream: bool) -> None:
        body = {**prompt, "sampling_params": params, "stream": stream}
        _fuzz_post(hard, "/generate", json.dumps(body).encode())

    @settings(FUZZ, max_examples=150)
    @given(params=sampling_params_strategy().map(bound_cost), chat=st.booleans())
    def openai(params: Any, chat: bool) -> None:
        if not isinstance(params, dict):
            return
        names = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}
        body = {names.get(k, k): v for k, v in params.items()}
        body.update({"messages": CHAT} if chat else {"prompt": "Hello"})
        _fuzz_post(hard, "/v1/chat/completions" if chat else "/v1/completions",
                   json.dumps(body).encode())

    native()
    openai()
    FUZZ_SECONDS.append(time.monotonic() - start)
    _alive(hard)


def test_fuzz_raw_bytes_methods_and_paths(hard: Hardened, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    start = time.monotonic()
    routes = [c[0] for c in FUZZ_CASES] + ["/flush_cache"]

    @settings(FUZZ, max_examples=150)
    @given(route=st.sampled_from(routes), content=st.binary(max_size=300))
    def raw(route: str, content: bytes) -> None:
        _fuzz_post(hard, route, content)

    @settings(FUZZ, max_examples=80)
    @given(method=st.sampled_from(["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]),
           path=st.sampled_from(routes + ["/health", "/health_generate", "/get_model_info",
                                          "/get_server_info", "/metrics", "/v1/models",
                                          "/api/tags", "/api/ps", "/api/version"])
           | st.text(st.characters(codec="ascii", categories=["L", "N"]), max_size=20).map(
               lambda s: "/v1/models/" + s))
    def other(method: str, path: str) -> None:
        r = hard.http.request(method, path, timeout=30)
        FUZZ_STATS[(f"{method} {path.split('/v1/models/')[0] or '/v1/models/<id>'}",
                    r.status_code)] += 1
        assert r.status_code < 500, (method, path, r.text)
        if r.status_code >= 400 and method != "HEAD":
            _check_error_shape(path, r.json())

    raw()
    other()
    FUZZ_SECONDS.append(time.monotonic() - start)
    _alive(hard)
    info = hard.http.get("/get_server_info").json()
    assert info["kv_integrity"] == "ok", info
    assert hard.http.get("/health").status_code == 200
    by_status = Counter[int]()
    for (_, status), count in FUZZ_STATS.items():
        by_status[status] += count
    with capsys.disabled():
        print(f"\nfuzz: {sum(by_status.values())} cases in {sum(FUZZ_SECONDS):.0f} s, "
              f"statuses {dict(sorted(by_status.items()))}")
