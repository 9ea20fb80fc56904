"""SGLang drop-in: its frontend language, routes, fields and wording, on the real server.

One server with the default model serves the module, with
`--enable-return-hidden-states` and a small queue (`--max-running-requests 2
--max-queued-requests 6`) so the 503 of a full queue can be reached. SGLang's
frontend language (`pip install --no-deps sglang`, scripts/setup.sh) drives
it through `RuntimeEndpoint` as its users do.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from _server_process import ServerProcess, running_server

PROMPT = "Once upon a time, in a small village by the sea, there lived"
GREEDY = {"temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = Path(tmp_path_factory.mktemp("sglang_dropin")) / "server.log"
    with running_server(log, "--enable-return-hidden-states", "--max-running-requests", "2",
                        "--max-queued-requests", "6") as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def oai(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def _generate(http: httpx.Client, **body: Any) -> Any:
    r = http.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _events(http: httpx.Client, path: str, body: dict[str, Any]) -> list[Any]:
    with http.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


# ---------------------------------------------------------------- the frontend language


def test_frontend_language_programs(server: ServerProcess) -> None:
    sgl = pytest.importorskip("sglang", reason="scripts/setup.sh installs sglang --no-deps")
    backend = sgl.RuntimeEndpoint(server.url, chat_template_name="chatml")
    sgl.set_default_backend(backend)

    @sgl.function
    def multi_turn(s: Any, q1: str, q2: str) -> None:
        s += sgl.user(q1)
        s += sgl.assistant(sgl.gen("a1", max_tokens=12, temperature=0))
        s += sgl.user(q2)
        s += sgl.assistant(sgl.gen("a2", max_tokens=12, temperature=0))

    @sgl.function
    def year(s: Any) -> None:
        s += "The year is " + sgl.gen("year", regex=r"[0-9]{4}", max_tokens=8, temperature=0)

    @sgl.function
    def pick(s: Any, method: Any) -> None:
        s += "Q: Is the sky blue? A:" + sgl.select("ans", choices=[" yes", " no"],
                                                   choices_method=method)

    @sgl.function
    def tips(s: Any) -> None:
        s += "Tips for staying healthy:\n"
        forks = s.fork(2)
        for i, f in enumerate(forks):
            f += f"{i + 1}." + sgl.gen("tip", max_tokens=8, temperature=0, stop="\n")
        forks.join()
        s += "In short:" + sgl.gen("summary", max_tokens=6, temperature=0)

    @sgl.function
    def legs(s: Any) -> None:
        s += "Q: How many legs does a dog have? A: " + sgl.gen("n", dtype=int, max_tokens=4)

    @sgl.function
    def person(s: Any) -> None:
        schema = json.dumps({"type": "object", "properties": {"name": {"type": "string"}},
                             "required": ["name"]})
        s += "A person as JSON: " + sgl.gen("j", json_schema=schema, max_tokens=24,
                                            temperature=0)

    @sgl.function
    def with_logprobs(s: Any) -> None:
        s += "Hello" + sgl.gen("x", max_tokens=3, return_logprob=True, top_logprobs_num=2,
                               temperature=0)

    st = multi_turn.run(q1="What is 1+1?", q2="And 2+2?")
    assert st["a1"] and st["a2"]
    assert st.text().count("<|im_start|>assistant") == 2  # the chatml template, both turns
    assert re.fullmatch(r"[0-9]{4}", year.run()["year"])
    for method in (sgl.token_length_normalized, sgl.unconditional_likelihood_normalized):
        st = pick.run(method=method)
        assert st["ans"] in (" yes", " no")
        meta = st.get_meta_info("ans")
        assert len(meta["normalized_prompt_logprobs"]) == 2
        if method is sgl.unconditional_likelihood_normalized:
            assert len(meta["normalized_unconditional_prompt_logprobs"]) == 2
    st = tips.run()
    assert st["summary"] and all(t for t in st["tip"])
    batch = year.run_batch([{}] * 3, num_threads=3)
    assert [b["year"] for b in batch] == [batch[0]["year"]] * 3  # greedy: the same
    streamed = multi_turn.run(q1="What is 1+1?", q2="And 2+2?", stream=True)
    pieces = list(streamed.text_iter())
    assert len(pieces) > 2 and "".join(pieces) == st_text(multi_turn, "What is 1+1?", "And 2+2?")
    assert isinstance(int(legs.run()["n"]), int)
    assert isinstance(json.loads(person.run()["j"])["name"], str)
    meta = with_logprobs.run().get_meta_info("x")
    assert len(meta["output_token_logprobs"]) == 3
    assert all(len(tops) == 2 for tops in meta["output_top_logprobs"])
    assert meta["input_token_logprobs"][0][0] is None
    sgl.flush_cache()
    info = sgl.get_server_info()
    assert info["num_running_reqs"] == 0 and "max_total_num_tokens" in info


def st_text(program: Any, q1: str, q2: str) -> str:
    return str(program.run(q1=q1, q2=q2).text())


# ---------------------------------------------------------------- stop_regex


def test_stop_regex_native_openai_and_streams(http: httpx.Client, oai: openai.OpenAI) -> None:
    full = _generate(http, text=PROMPT, sampling_params={**GREEDY, "max_new_tokens": 24})["text"]
    word = [w for w in re.findall(r"[a-z]{4,}", full)][1]
    pattern = "[" + word[0] + word[0].upper() + "]" + re.escape(word[1:])
    match = re.search(pattern, full)
    assert match is not None
    want = full[: match.start()]
    params = {**GREEDY, "max_new_tokens": 24, "stop_regex": pattern}
    out = _generate(http, text=PROMPT, sampling_params=params)
    assert out["text"] == want
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    kept = _generate(http, text=PROMPT, sampling_params={**params, "no_stop_trim": True})
    assert kept["text"] == full[: match.end()]
    events = _events(http, "/generate", {"text": PROMPT, "stream": True,
                                         "sampling_params": {**params, "stop_regex": [pattern]}})
    deltas = [e["delta"] for e in events]
    assert "".join(deltas) == want and len(deltas) > 2
    r = oai.completions.create(model="m", prompt=PROMPT, max_tokens=24, temperature=0,
                               extra_body={"stop_regex": pattern, "ignore_eos": True})
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop"
    assert r.choices[0].model_extra["matched_stop"] == pattern
    chunks = list(oai.completions.create(model="m", prompt=PROMPT, max_tokens=24, temperature=0,
                                         stream=True, extra_body={"stop_regex": [pattern],
                                                                  "ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want
    chat = oai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Say hello."}], max_tokens=8,
        temperature=0, extra_body={"stop_regex": r"[Hh]ello"})
    assert "ello" not in (chat.choices[0].message.content or "")
    bad = http.post("/generate", json={"text": "x", "sampling_params": {"stop_regex": "("}})
    assert bad.status_code == 400 and "not a valid regex" in bad.json()["message"]


# ---------------------------------------------------------------- logprobs, routes, fields


def test_logprob_shapes_without_logprob_start_len(http: httpx.Client) -> None:
    out = _generate(http, text=PROMPT, return_logprob=True,
                    sampling_params={**GREEDY, "max_new_tokens": 2})
    meta = out["meta_info"]
    entries = meta["input_token_logprobs"]
    assert len(entries) == meta["prompt_tokens"]
    ids = http.post("/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    assert entries[0] == [None, ids[0], http.post("/detokenize",
                                                  json={"tokens": [ids[0]]}).json()["text"]]
    assert [e[1] for e in entries] == ids
    assert all(isinstance(e[0], float) and e[0] <= 0 for e in entries[1:])
    assert [e[1] for e in meta["output_token_logprobs"]] == out["output_ids"]


def test_sglang_route_names(http: httpx.Client) -> None:
    tok = http.post("/tokenize", json={"prompt": "Hello world"}).json()
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] > 0
    assert http.post("/detokenize", json={"tokens": tok["tokens"]}).json()["text"] == "Hello world"
    info = http.get("/server_info").json()
    assert set(info) == set(http.get("/get_server_info").json())
    model = http.get("/model_info").json()
    assert model == http.get("/get_model_info").json()
    # The path the user gave (here the packaged default GGUF), not the conversion cache.
    assert model["model_path"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")


def test_score(http: httpx.Client) -> None:
    labels = http.post("/tokenize", json={"prompt": [" Paris", " London"]}).json()["tokens"]
    label_ids = [ids[0] for ids in labels]
    body = {"query": "The capital of France is", "items": ["", " the city of"],
            "label_token_ids": label_ids}
    r = http.post("/v1/score", json={**body, "return_token_logprobs": True})
    assert r.status_code == 200, r.text
    scored = r.json()
    assert scored["object"] == "scoring" and len(scored["scores"]) == 2
    # Cross-check: the first item's next-token distribution, from a plain generate.
    out = _generate(http, text="The capital of France is", return_logprob=True,
                    top_logprobs_num=50, sampling_params={"max_new_tokens": 1, "temperature": 0})
    tops = {e[1]: e[0] for e in out["meta_info"]["output_top_logprobs"][0]}
    for label, score, lp in zip(label_ids, scored["scores"][0], scored["token_logprobs"][0]):
        assert 0.0 < score < 1.0 and abs(score - math.exp(lp)) < 1e-6
        if label in tops:
            assert abs(lp - tops[label]) < 1e-3
    soft = http.post("/v1/score", json={**body, "apply_softmax": True}).json()["scores"]
    assert all(abs(sum(row) - 1.0) < 1e-6 for row in soft)
    assert soft[0][0] > soft[0][1]  # Paris, not London
    for bad, message in [({"label_token_ids": [label_ids[0]] * 2}, "duplicate"),
                         ({"label_token_ids": [10**9]}, "out of vocabulary"),
                         ({"temperature": 0.5}, "apply_softmax")]:
        r = http.post("/v1/score", json={**body, **bad})
        assert r.status_code == 400 and message in r.json()["message"], r.text


def test_unknown_top_level_fields_are_ignored(http: httpx.Client) -> None:
    body = {"text": "Hi", "sampling_params": {"max_new_tokens": 1}, "lora_path": "adapter",
            "custom_logit_processor": "x", "bootstrap_host": "h"}
    assert http.post("/generate", json=body).status_code == 200
    r = http.post("/generate", json={"text": "Hi", "sampling_params": {"no_such_param": 1}})
    assert r.status_code == 400 and "no_such_param" in r.json()["message"]
    r = http.post("/generate", json={"text": "Hi", "return_logprob": "yes"})
    assert r.status_code == 400


def test_error_wording(http: httpx.Client, oai: openai.OpenAI) -> None:
    context = http.get("/model_info").json()["context_length"]
    r = http.post("/generate", json={"input_ids": [1] * (context + 5)})
    assert r.status_code == 400
    assert (f"The input ({context + 5} tokens) is longer than the model's context length "
            f"({context} tokens)") in r.json()["message"]
    with pytest.raises(openai.BadRequestError, match="max_completion_tokens is too large: "
                       f"{context * 2}"):
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}],
                                    max_tokens=context * 2)


# ---------------------------------------------------------------- hidden states


def test_return_hidden_states(http: httpx.Client, oai: openai.OpenAI) -> None:
    body = {"text": PROMPT, "return_hidden_states": True,
            "sampling_params": {**GREEDY, "max_new_tokens": 3}}
    first = _generate(http, **body)
    again = _generate(http, **body)  # the prompt is cached now: still every position
    meta = first["meta_info"]
    hidden = meta["hidden_states"]
    assert len(hidden) == 1 + 2  # the prompt's rows, then one per decode step
    assert len(hidden[0]) == meta["prompt_tokens"]
    size = len(hidden[1])
    assert size == 576 and all(len(row) == size for row in hidden[0])
    assert _close(hidden, again["meta_info"]["hidden_states"])
    events = _events(http, "/generate", {**body, "stream": True})
    assert _close(events[-1]["meta_info"]["hidden_states"], hidden)
    assert "hidden_states" not in _generate(http, text="x", sampling_params={
        "max_new_tokens": 1})["meta_info"]
    r = oai.completions.create(model="m", prompt=PROMPT, max_tokens=3, temperature=0,
                               extra_body={"return_hidden_states": True, "ignore_eos": True})
    assert _close(r.choices[0].model_extra["hidden_states"], hidden[-1])
    chunks = list(oai.completions.create(model="m", prompt=PROMPT, max_tokens=3, temperature=0,
                                         stream=True, extra_body={"return_hidden_states": True,
                                                                  "ignore_eos": True}))
    with_hidden = [c.choices[0].model_extra.get("hidden_states") for c in chunks if c.choices]
    assert _close([h for h in with_hidden if h][0], hidden[-1])
    chat = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=2, extra_body={"return_hidden_states": True})
    assert len(chat.choices[0].model_extra["hidden_states"]) in (0, size)


def _close(a: Any, b: Any, tol: float = 1e-3) -> bool:
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return bool(abs(a - b) <= tol * (1 + abs(b)))


# ---------------------------------------------------------------- structural tags, queue


def test_structural_tag_format_form(oai: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    fmt = {"type": "tag", "begin": "<answer>",
           "content": {"type": "json_schema", "json_schema": schema}, "end": "</answer>"}
    r = oai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Where is the Eiffel Tower?"}],
        max_tokens=40, temperature=0,
        response_format={"type": "structural_tag", "format": fmt})  # type: ignore[arg-type]
    text = r.choices[0].message.content or ""
    assert text.startswith("<answer>"), text
    if r.choices[0].finish_reason == "stop":
        assert text.endswith("</answer>")
        assert "city" in json.loads(text[len("<answer>"):-len("</answer>")])
    with pytest.raises(openai.BadRequestError, match="either"):
        oai.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2,
            response_format={"type": "structural_tag", "format": fmt,  # type: ignore[arg-type]
                             "structures": [], "triggers": []})


def test_full_queue_answers_503(server: ServerProcess) -> None:
    results: list[tuple[int, str]] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        body = {"text": f"Story number {i}:", "sampling_params": {**GREEDY,
                                                                   "max_new_tokens": 48}}
        r = httpx.post(server.url + "/generate", json=body, timeout=120)
        with lock:
            results.append((r.status_code, r.text))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    codes = sorted(code for code, _ in results)
    # 2 run and 6 wait at most: of 12 sent at once, at least 6 are served, some refused.
    assert len(codes) == 12 and codes.count(200) >= 6 and 503 in codes, results
    assert all("The request queue is full." in text for code, text in results if code == 503)
