"""BatchManager without a model: a restart resumes a half-done batch without losing or
repeating results, cancel keeps what finished, bad lines get error entries, the
storage bound holds."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from radixlm.entrypoints.openai.batch_manager import BatchManager, parse_line
from radixlm.entrypoints.openai.file_store import FileStore, StorageFull

URL = "/v1/completions"


def _line(i: int) -> str:
    return json.dumps({"custom_id": f"r{i}", "method": "POST", "url": URL,
                       "body": {"prompt": f"p{i}"}})


class FakeRoute:
    """Answers line i at once for i < open_below, else waits for `release`."""

    def __init__(self, open_below: int) -> None:
        self.open_below = open_below
        self.release = asyncio.Event()
        self.calls: list[str] = []

    async def __call__(self, url: str, body: dict[str, Any], rid: str) -> tuple[int, dict[str, Any]]:
        self.calls.append(body["prompt"])
        if int(body["prompt"][1:]) >= self.open_below:
            await self.release.wait()
        if body["prompt"] == "p1":
            return 400, {"error": {"message": "bad", "type": "BadRequestError"}}
        return 200, {"choices": [{"text": body["prompt"].upper()}]}


async def _ready() -> bool:
    return True


def _manager(root: Path, route: FakeRoute, files: FileStore | None = None) -> BatchManager:
    return BatchManager(root, files or FileStore(root, 1 << 20), route, concurrency=2,
                        is_ready=_ready)


async def _until(predicate: Any, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


def test_restart_resumes_without_loss_or_repeats(tmp_path: Path) -> None:
    async def run() -> None:
        route = FakeRoute(open_below=3)
        manager = _manager(tmp_path, route)
        manager.start()
        data = ("\n".join(_line(i) for i in range(6)) + "\n{not json\n").encode()
        file = manager.files.create(data, "in.jsonl", "batch")
        batch = manager.create(file.id, URL, None)
        await _until(lambda: batch["request_counts"]["completed"] +
                     batch["request_counts"]["failed"] >= 3)
        await manager.stop()  # the server stops with lines 3.. in flight or not started
        assert batch["status"] == "in_progress"

        route2 = FakeRoute(open_below=100)
        manager2 = _manager(tmp_path, route2)
        manager2.start()
        again = manager2.get(batch["id"])
        assert again is not None
        await _until(lambda: again["status"] == "completed")
        assert sorted(route2.calls) == ["p3", "p4", "p5"]  # nothing answered twice
        assert again["request_counts"] == {"total": 7, "completed": 5, "failed": 2}
        out = [json.loads(x) for x in manager2.files.read(again["output_file_id"]).splitlines()]
        assert sorted(o["custom_id"] for o in out) == ["r0", "r2", "r3", "r4", "r5"]
        assert all(o["response"]["body"]["choices"][0]["text"] == o["custom_id"].replace("r", "P")
                   for o in out)
        errs = [json.loads(x) for x in manager2.files.read(again["error_file_id"]).splitlines()]
        codes = sorted((e["custom_id"] or "", e["error"] and e["error"]["code"]) for e in errs)
        assert codes == [("", "invalid_json_line"), ("r1", None)]
        await manager2.stop()

    asyncio.run(run())


def test_cancel_keeps_finished_results(tmp_path: Path) -> None:
    async def run() -> None:
        route = FakeRoute(open_below=2)
        manager = _manager(tmp_path, route)
        manager.start()
        file = manager.files.create("\n".join(_line(i) for i in range(10)).encode(), "x", "batch")
        batch = manager.create(file.id, URL, {"k": "v"})
        await _until(lambda: batch["request_counts"]["completed"] == 1)
        manager.cancel(batch["id"])
        await _until(lambda: batch["status"] == "cancelled")
        assert batch["request_counts"]["completed"] == 1
        assert len(route.calls) <= 4  # at most two in flight beyond the first two
        await manager.stop()

    asyncio.run(run())


def test_parse_line_errors() -> None:
    assert parse_line("[]", 0, URL)["error"]["code"] == "invalid_json_line"  # type: ignore[index]
    bad = parse_line(json.dumps({"custom_id": 3, "url": "/v1/chat/completions", "body": []}), 4,
                     URL)
    assert isinstance(bad, dict) and bad["error"]["code"] == "invalid_request"
    message = bad["error"]["message"]
    assert message.startswith("Line 5") and "custom_id" in message and "url" in message
    assert parse_line(_line(1), 0, URL) == ("r1", {"prompt": "p1"})


def test_file_store_bound_and_persistence(tmp_path: Path) -> None:
    store = FileStore(tmp_path, max_bytes=10)
    obj = store.create(b"123456", "a.jsonl", "batch")
    with pytest.raises(StorageFull, match="limit of 10"):
        store.create(b"12345", "b.jsonl", "batch")
    reopened = FileStore(tmp_path, max_bytes=10)
    assert reopened.get(obj.id) == obj and reopened.read(obj.id) == b"123456"
    assert reopened.delete(obj.id) and reopened.get(obj.id) is None
    assert reopened.used_bytes == 0
