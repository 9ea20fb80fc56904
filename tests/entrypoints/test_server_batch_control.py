"""End to end: the Batch API, weight updates and the profiler on tiny Qwen2 checkpoints.

One server on checkpoint A (`--max-running-requests 4`, so a batch runs two
requests at a time beside online traffic) serves the module until the last
test, which restarts the server on checkpoint B with the same
`--file-storage-path`: finished batches and their files must still be there,
and its greedy output must equal what A's server produced after updating its
weights to B. Tests run in file order.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import openai
import pytest
from _server_process import ServerProcess
from _tiny_checkpoints import build_qwen2, load_reference, reference_greedy

NUM_NEW = 8
GREEDY = {"temperature": 0, "max_tokens": NUM_NEW, "ignore_eos": True}
CLIENT_GREEDY = {"temperature": 0, "max_tokens": NUM_NEW, "extra_body": {"ignore_eos": True}}
PROMPT = "Once upon a time"


class Served(NamedTuple):
    srv: ServerProcess
    http: httpx.Client
    oai: openai.OpenAI
    root: Path


def _start(root: Path, model: Path) -> ServerProcess:
    srv = ServerProcess(root / f"server-{model.name}.log", "--model-path", str(model),
                        "--max-running-requests", "4", "--file-storage-path",
                        str(root / "storage"), "--profile-dir", str(root / "profiles"))
    srv.wait_healthy()
    return srv


def _clients(srv: ServerProcess, root: Path) -> Served:
    http = httpx.Client(base_url=srv.url, timeout=120)
    oai = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
    return Served(srv, http, oai, root)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("batch")
    build_qwen2(root / "A", "causal", seed=1)
    build_qwen2(root / "B", "causal", seed=2)
    build_qwen2(root / "wide", "causal", seed=3, intermediate_size=96)
    build_qwen2(root / "embedding", "embedding", seed=4)
    return root


@pytest.fixture(scope="module")
def served(root: Path) -> Iterator[Served]:
    srv = _start(root, root / "A")
    try:
        yield _clients(srv, root)
    finally:
        srv.stop(signal.SIGKILL, timeout=1)


def _jsonl(lines: list[Any]) -> bytes:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode()


def _wait(oai: openai.OpenAI, batch_id: str, statuses: set[str], timeout: float = 180) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        batch = oai.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)


def _chat_body(i: int) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"Question number {i}?"}], **GREEDY}


def _completion_body(i: int) -> dict[str, Any]:
    return {"prompt": f"Item {i}:", **GREEDY}


# ---------------------------------------------------------------- batches


def test_batch_of_chat_and_completions_beside_online_traffic(served: Served) -> None:
    oai = served.oai
    chat_lines: list[Any] = [{"custom_id": f"chat-{i}", "method": "POST",
                              "url": "/v1/chat/completions", "body": _chat_body(i)}
                             for i in range(11)]
    chat_lines.insert(5, '{"custom_id": "broken", "body": {')  # a malformed line
    completion_lines = [{"custom_id": f"cmpl-{i}", "method": "POST", "url": "/v1/completions",
                         "body": _completion_body(i)} for i in range(9)]
    chat_file = oai.files.create(file=("chat.jsonl", _jsonl(chat_lines)), purpose="batch")
    cmpl_file = oai.files.create(file=("cmpl.jsonl", _jsonl(completion_lines)), purpose="batch")
    assert chat_file.purpose == "batch" and chat_file.filename == "chat.jsonl"
    chat = oai.batches.create(input_file_id=chat_file.id, endpoint="/v1/chat/completions",
                              completion_window="24h", metadata={"run": "test"})
    cmpl = oai.batches.create(input_file_id=cmpl_file.id, endpoint="/v1/completions",
                              completion_window="24h")
    # Online requests are served while the batches run.
    for i in range(3):
        reply = oai.completions.create(model="m", prompt=f"Online {i}", **CLIENT_GREEDY)
        assert reply.usage.completion_tokens == NUM_NEW
    chat = _wait(oai, chat.id, {"completed", "failed"})
    cmpl = _wait(oai, cmpl.id, {"completed", "failed"})
    assert chat.status == cmpl.status == "completed", (chat, cmpl)
    assert chat.metadata == {"run": "test"}
    assert (chat.request_counts.total, chat.request_counts.completed,
            chat.request_counts.failed) == (12, 11, 1)
    assert (cmpl.request_counts.completed, cmpl.request_counts.failed) == (9, 0)
    outputs = [json.loads(x) for x in oai.files.content(chat.output_file_id).text.splitlines()]
    assert sorted(o["custom_id"] for o in outputs) == sorted(f"chat-{i}" for i in range(11))
    errors = [json.loads(x) for x in oai.files.content(chat.error_file_id).text.splitlines()]
    assert len(errors) == 1 and errors[0]["response"] is None
    assert errors[0]["error"]["code"] == "invalid_json_line" and "Line 6" in \
        errors[0]["error"]["message"]
    for out in outputs:
        i = int(out["custom_id"].split("-")[1])
        assert out["response"]["status_code"] == 200 and out["error"] is None
        online = served.http.post("/v1/chat/completions", json=_chat_body(i)).json()
        assert out["response"]["body"]["choices"][0]["message"]["content"] == \
            online["choices"][0]["message"]["content"]
    cmpl_out = [json.loads(x) for x in oai.files.content(cmpl.output_file_id).text.splitlines()]
    for out in cmpl_out:
        i = int(out["custom_id"].split("-")[1])
        online = served.http.post("/v1/completions", json=_completion_body(i)).json()
        assert out["response"]["body"]["choices"][0]["text"] == online["choices"][0]["text"]
    listed = oai.batches.list(limit=10)
    assert {chat.id, cmpl.id} <= {b.id for b in listed.data}
    assert oai.files.retrieve(chat.output_file_id).purpose == "batch_output"


def test_cancel_stops_unfinished_requests(served: Served) -> None:
    oai = served.oai
    long = {"temperature": 0, "max_tokens": 400, "ignore_eos": True}
    lines = [{"custom_id": f"long-{i}", "method": "POST", "url": "/v1/completions",
              "body": {"prompt": f"Long {i}", **long}} for i in range(40)]
    file = oai.files.create(file=("long.jsonl", _jsonl(lines)), purpose="batch")
    batch = oai.batches.create(input_file_id=file.id, endpoint="/v1/completions",
                               completion_window="24h")
    _wait(oai, batch.id, {"in_progress"})
    cancelling = oai.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = _wait(oai, batch.id, {"cancelled"}, timeout=30)
    assert done.request_counts.completed < 40 and done.cancelled_at is not None
    info = served.http.get("/get_server_info").json()
    assert info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0
    assert info["kv_integrity"] == "ok"
    r = served.http.post(f"/v1/batches/{batch.id}/cancel")
    assert r.status_code == 409 and "already cancelled" in r.json()["message"]


def test_batch_and_file_bad_inputs(served: Served) -> None:
    http = served.http
    r = http.post("/v1/files", files={"file": ("x.jsonl", b"{}\n")}, data={"purpose": "fine-tune"})
    assert r.status_code == 400 and "purpose" in r.json()["message"]
    r = http.post("/v1/files", files={"file": ("x.jsonl", b"{}\n")})
    assert r.status_code == 400 and "purpose" in r.json()["message"]
    r = http.post("/v1/files", json={"purpose": "batch"})
    assert r.status_code == 400 and "multipart" in r.json()["message"]
    for method, path in (("GET", "/v1/files/file-000000000000000000000000"),
                         ("GET", "/v1/files/nope/content"), ("DELETE", "/v1/files/nope"),
                         ("GET", "/v1/batches/batch_nope"),
                         ("POST", "/v1/batches/batch_nope/cancel")):
        r = http.request(method, path)
        assert r.status_code == 404 and "No such" in r.json()["message"], (path, r.text)
    body = {"input_file_id": "file-nope", "endpoint": "/v1/completions"}
    r = http.post("/v1/batches", json=body)
    assert r.status_code == 404 and "file-nope" in r.json()["message"]
    r = http.post("/v1/batches", json={**body, "endpoint": "/v1/embeddings"})
    assert r.status_code == 400 and "Unsupported endpoint" in r.json()["message"]
    r = http.post("/v1/batches", json={**body, "completion_window": "1h"})
    assert r.status_code == 400
    r = http.post("/v1/embeddings", json={"input": "hi"})
    assert r.status_code == 400 and "generates text" in r.json()["message"]
    r = http.post("/encode", json={"text": "hi"})
    assert r.status_code == 400 and "generates text" in r.json()["message"]


# ---------------------------------------------------------------- profiler


def test_profile_writes_a_trace_torch_can_read(served: Served) -> None:
    from torch.profiler._trace_validator import _load_events, validate_trace

    http = served.http
    out_dir = served.root / "trace"
    r = http.post("/start_profile", json={"output_dir": str(out_dir), "num_steps": 3,
                                          "profile_id": "t"})
    assert r.status_code == 200 and "Start profiling" in r.text
    assert http.post("/start_profile", json={}).status_code == 400  # one at a time
    served.oai.completions.create(model="m", prompt=PROMPT, **CLIENT_GREEDY)
    path = out_dir / "t-TP-0.trace.json.gz"
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    passed, violations = validate_trace(str(path))
    assert passed, violations
    names = {e.get("name", "") for e in _load_events(str(path))}
    assert any(n.startswith("aten::") for n in names)
    r = http.post("/stop_profile")
    assert r.status_code == 200 and "already stopped" in r.text
    for body in ({"num_steps": 0}, {"activities": ["TPU"]}, {"num_steps": "3"}):
        r = http.post("/start_profile", json=body)
        assert r.status_code == 400, body
    assert http.get("/start_profile").status_code == 405


# ---------------------------------------------------------------- weight updates


def _greedy(served: Served) -> str:
    reply = served.oai.completions.create(model="m", prompt=PROMPT, **CLIENT_GREEDY)
    return reply.choices[0].text


def test_update_weights_swaps_to_the_new_checkpoint(served: Served, root: Path) -> None:
    http = served.http
    before = _greedy(served)
    info = http.get("/get_server_info").json()
    assert info["model_path"] == str(root / "A")
    # A request in flight when the update arrives finishes on the old weights.
    with httpx.Client(base_url=served.srv.url, timeout=120) as other:
        import threading

        result: dict[str, Any] = {}

        def long_request() -> None:
            result["r"] = other.post("/v1/completions", json={
                "prompt": PROMPT, "temperature": 0, "max_tokens": 300, "ignore_eos": True})

        t = threading.Thread(target=long_request)
        t.start()
        time.sleep(0.3)
        r = http.post("/update_weights_from_disk", json={"model_path": str(root / "B")})
        t.join(60)
    assert r.status_code == 200 and r.json()["success"] is True, r.text
    assert result["r"].json()["choices"][0]["finish_reason"] == "length"
    after = _greedy(served)
    assert after != before
    assert http.get("/get_model_info").json()["model_path"] == str(root / "B")
    # Wrong shapes and architectures are refused; the weights in service stay.
    for path, needle in ((root / "wide", "shape"), (root / "embedding", "architecture"),
                         (root / "missing", "Cannot use")):
        r = http.post("/update_weights_from_disk", json={"model_path": str(path)})
        assert r.status_code == 400 and r.json()["success"] is False, r.text
        assert needle in r.json()["message"]
        assert _greedy(served) == after
    r = http.post("/update_weights_from_disk", json={"model_path": str(root / "B"),
                                                     "load_format": "gguf"})
    assert r.status_code == 400 and "load_format" in r.json()["message"]
    info = http.get("/get_server_info").json()
    assert info["kv_integrity"] == "ok" and info["num_running_reqs"] == 0
    (root / "after_update.txt").write_text(after)


def test_restart_keeps_results_and_fresh_server_matches_update(served: Served, root: Path
                                                               ) -> None:
    batches_before = {b.id: b for b in served.oai.batches.list(limit=50).data}
    completed = [b for b in batches_before.values() if b.status == "completed"]
    contents = {b.id: served.oai.files.content(b.output_file_id).text for b in completed}
    assert served.srv.stop() == 0, served.srv.log_tail()
    srv = _start(root, root / "B")
    try:
        fresh = _clients(srv, root)
        for b in completed:
            again = fresh.oai.batches.retrieve(b.id)
            assert again.status == "completed" and again.output_file_id == b.output_file_id
            assert fresh.oai.files.content(b.output_file_id).text == contents[b.id]
        assert _greedy(fresh) == (root / "after_update.txt").read_text()
        ref = load_reference(root / "B", "causal")
        tok_ids = fresh.http.post("/v1/tokenize", json={"prompt": PROMPT}).json()["tokens"]
        expected = fresh.http.post("/v1/detokenize", json={
            "tokens": reference_greedy(ref, tok_ids, NUM_NEW)}).json()["text"]
        assert _greedy(fresh) == expected
    finally:
        srv.stop(signal.SIGKILL, timeout=1)
