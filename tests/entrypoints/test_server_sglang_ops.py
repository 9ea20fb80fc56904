"""What an SGLang operator and an RL framework rely on, through a real server on the
default model: --skip-tokenizer-init (token ids in, token ids out), priority
scheduling over HTTP, the 'Prefill batch.' / 'Decode batch.' / abort log lines, and
the sglang:* metric names.

One extra server serves this module, started with --skip-tokenizer-init
--enable-priority-scheduling --max-running-requests 1 (so the queue order is
visible in the order requests finish) --decode-log-interval 5 --enable-metrics;
the shared session server (conftest.py) is the tokenizer-backed reference.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from _server_process import ServerProcess, running_server

PROMPT_IDS = [1, 504, 3575, 282, 4649, 314]  # a few ordinary SmolLM2 token ids


@pytest.fixture(scope="module")
def ids_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = Path(tmp_path_factory.mktemp("ids_server")) / "server.log"
    with running_server(log, "--skip-tokenizer-init", "--enable-priority-scheduling",
                        "--max-running-requests", "1", "--decode-log-interval", "5",
                        "--enable-metrics") as srv:
        yield srv


@pytest.fixture(scope="module")
def ids_http(ids_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=ids_server.url, timeout=120) as c:
        yield c


def _generate(client: httpx.Client, max_new_tokens: int, **extra: Any) -> httpx.Response:
    return client.post("/generate", json={
        "input_ids": PROMPT_IDS, **extra,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0,
                            "ignore_eos": True}})


# ---------------------------------------------------------------- --skip-tokenizer-init


def test_token_ids_in_token_ids_out(ids_http: httpx.Client, http: httpx.Client) -> None:
    r = _generate(ids_http, 8, return_logprob=True, top_logprobs_num=2)
    assert r.status_code == 200, r.text
    out = r.json()
    assert "text" not in out and set(out) >= {"output_ids", "meta_info"}
    assert out["meta_info"]["completion_tokens"] == 8
    lp = out["meta_info"]["output_token_logprobs"]
    assert [e[1] for e in lp] == out["output_ids"] and all(e[2] is None for e in lp)
    # The same greedy tokens as the tokenizer-backed server.
    assert out["output_ids"] == _generate(http, 8).json()["output_ids"]
    with ids_http.stream("POST", "/generate", json={
            "input_ids": PROMPT_IDS, "stream": True,
            "sampling_params": {"max_new_tokens": 4, "temperature": 0}}) as s:
        events = [json.loads(ln[6:]) for ln in s.iter_lines()
                  if ln.startswith("data: ") and ln != "data: [DONE]"]
    assert events and all("text" not in e and "delta" not in e for e in events)
    assert events[-1]["output_ids"] == out["output_ids"][: len(events[-1]["output_ids"])]


@pytest.mark.parametrize(("body", "needle"), [
    ({"text": "Hello"}, "send 'input_ids'"),
    ({"input_ids": PROMPT_IDS, "sampling_params": {"stop": ["."]}}, "stop_token_ids"),
    ({"input_ids": PROMPT_IDS, "sampling_params": {"regex": "a+"}}, "'regex'"),
    ({"input_ids": PROMPT_IDS, "sampling_params": {"stop_regex": "a+"}}, "'stop_regex'"),
])
def test_what_needs_the_tokenizer_is_a_400(ids_http: httpx.Client, body: dict,
                                           needle: str) -> None:
    r = ids_http.post("/generate", json=body)
    assert r.status_code == 400, r.text
    assert "--skip-tokenizer-init" in r.json()["message"] and needle in r.json()["message"]


def test_openai_routes_say_why_they_cannot_serve(ids_server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=ids_server.url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="skip-tokenizer-init"):
        client.chat.completions.create(model="default", max_tokens=2,
                                       messages=[{"role": "user", "content": "Hi"}])
    with pytest.raises(openai.BadRequestError, match="skip-tokenizer-init"):
        client.completions.create(model="default", prompt=PROMPT_IDS, max_tokens=2)


# ---------------------------------------------------------------- priority


def test_priority_orders_the_queue_and_preempts(ids_server: ServerProcess,
                                                ids_http: httpx.Client) -> None:
    """SGLang's semantics: larger is more urgent; past the threshold (10) a request
    preempts the running one, which resumes later with the same tokens."""
    reference = _generate(ids_http, 60).json()["output_ids"]
    finished: list[str] = []
    results: dict[str, Any] = {}
    started = threading.Event()

    def long_stream() -> None:
        ids: list[int] = []
        with httpx.stream("POST", ids_server.url + "/generate", timeout=120, json={
                "input_ids": PROMPT_IDS, "stream": True, "priority": 0,
                "sampling_params": {"max_new_tokens": 60, "temperature": 0,
                                    "ignore_eos": True}}) as s:
            for line in s.iter_lines():
                if line.startswith("data: {"):
                    ids = json.loads(line[6:])["output_ids"]
                    started.set()
        results["first"] = ids
        finished.append("first")

    def short(name: str, priority: int) -> None:
        results[name] = _generate(httpx.Client(base_url=ids_server.url, timeout=120), 3,
                                  priority=priority)
        finished.append(name)

    threads = [threading.Thread(target=long_stream)]
    threads[0].start()
    assert started.wait(60)
    threads.append(threading.Thread(target=short, args=("p5", 5)))
    threads[-1].start()
    _wait_queued(ids_http, 1)
    threads.append(threading.Thread(target=short, args=("p30", 30)))  # preempts "first"
    threads[-1].start()
    for t in threads:
        t.join(120)
    assert finished == ["p30", "p5", "first"]
    assert results["first"] == reference
    assert all(results[k].status_code == 200 for k in ("p5", "p30"))
    assert ids_http.get("/get_server_info").json()["num_preemptions"] >= 1
    bad = ids_http.post("/generate", json={"input_ids": PROMPT_IDS, "priority": "high"})
    assert bad.status_code == 400 and "priority" in bad.text


def _wait_queued(client: httpx.Client, n: int) -> None:
    for _ in range(200):
        if client.get("/get_server_info").json()["num_waiting_reqs"] >= n:
            return
        time.sleep(0.02)
    raise AssertionError("the request never queued")


def test_priority_is_ignored_without_the_flag(oai: Any, http: httpx.Client) -> None:
    # As SGLang: accepted (and ignored) unless --abort-on-priority-when-disabled.
    r = oai.completions.create(model="default", prompt="Hi", max_tokens=2,
                               extra_body={"priority": 7})
    assert r.choices[0].text is not None
    with pytest.raises(openai.BadRequestError, match="priority"):
        oai.chat.completions.create(model="default", max_tokens=2, extra_body={
            "priority": 1.5}, messages=[{"role": "user", "content": "Hi"}])
    assert http.post("/generate", json={"text": "Hi", "priority": 3, "sampling_params": {
        "max_new_tokens": 2}}).status_code == 200


# ---------------------------------------------------------------- logs and metrics


def test_log_lines_and_sglang_metric_names(ids_server: ServerProcess,
                                           ids_http: httpx.Client) -> None:
    with httpx.stream("POST", ids_server.url + "/generate", timeout=120, json={
            "input_ids": PROMPT_IDS, "stream": True, "rid": "to-abort",
            "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}) as s:
        for i, _line in enumerate(s.iter_lines()):
            if i == 20:
                ids_http.post("/abort_request", json={"rid": "to-abort"})
    log = ids_server.log_path.read_text(errors="replace")
    assert "Prefill batch. #new-seq: 1, #new-token: 6, #cached-token: 0, token usage: " in log
    assert "Decode batch. #running-req: 1, #token: " in log
    assert "gen throughput (token/s): " in log and "#queue-req: 0," in log
    assert ("Abort running request. rid='to-abort', reason: Aborted by POST /abort_request"
            in log)
    text = ids_http.get("/metrics").text
    for name in ("num_running_reqs", "num_queue_reqs", "token_usage", "cache_hit_rate",
                 "gen_throughput", "num_grammar_queue_reqs", "prompt_tokens_total",
                 "generation_tokens_total", "inter_token_latency_seconds_count",
                 "time_to_first_token_seconds_bucket", "e2e_request_latency_seconds_sum"):
        for prefix in ("sglang", "radixlm"):
            assert f"{prefix}:{name}" in text, f"{prefix}:{name}"
    itl = next(ln for ln in text.splitlines()
               if ln.startswith("sglang:inter_token_latency_seconds_count"))
    assert float(itl.split()[-1]) > 10
    gen = next(ln for ln in text.splitlines() if ln.startswith("sglang:gen_throughput"))
    assert float(gen.split()[-1]) > 0
