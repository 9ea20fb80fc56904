"""The OpenAI Batch API's jobs: a JSONL file of requests, run beside online traffic.

Life of a batch (OpenAI's statuses):

    validating ──> in_progress ──> finalizing ──> completed
        │               ├──cancel──> cancelling ──> cancelled
        │               └──past expires_at──> expired
        └── unreadable input ──> failed

Each input line is `{"custom_id", "method": "POST", "url": <the batch's
endpoint>, "body": {...}}`. Lines run through the same route handlers as
online requests (`RunRequest`), at most `concurrency` at a time, as
background traffic (the scheduler admits them after online requests). Each
answer is written as soon as it is known, as OpenAI writes it: a 2xx goes to
the output file, anything else to the error file, as
`{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`;
a line that is not a valid request gets `"response": null` and an `error`
with a code (`invalid_json_line`, `invalid_request`) and the rest go on.

Persistence, under `<root>/batches/`: `<id>.json` (the Batch object),
`<id>.output.jsonl` and `<id>.errors.jsonl` (written line by line), and
`<id>.done` (the input line numbers already answered). A server that
restarts resumes unfinished batches where they stopped, so no finished
result is lost; requests cut short by the shutdown are run again. At the
end the two result files move into the FileStore (purpose `batch_output`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from radixlm.entrypoints.openai.file_store import FileStore, StorageFull

logger = logging.getLogger(__name__)

# (url, body, request id) → (HTTP status, JSON body), as the online route would answer.
RunRequest = Callable[[str, dict[str, Any], str], Awaitable[tuple[int, dict[str, Any]]]]

COMPLETION_WINDOW = 24 * 3600  # "24h", the only window OpenAI offers
MAX_REQUESTS_PER_BATCH = 50_000  # OpenAI's limit
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})


class BatchError(ValueError):
    """A batch request that cannot be accepted (the route answers 400)."""


def _now() -> int:
    return int(time.time())


def new_batch(input_file_id: str, endpoint: str, metadata: dict[str, str] | None
              ) -> dict[str, Any]:
    created = _now()
    return {
        "id": f"batch_{uuid.uuid4().hex[:24]}", "object": "batch", "endpoint": endpoint,
        "errors": None, "input_file_id": input_file_id, "completion_window": "24h",
        "status": "validating", "output_file_id": None, "error_file_id": None,
        "created_at": created, "in_progress_at": None,
        "expires_at": created + COMPLETION_WINDOW, "finalizing_at": None,
        "completed_at": None, "failed_at": None, "expired_at": None,
        "cancelling_at": None, "cancelled_at": None,
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "metadata": metadata,
    }


class BatchManager:
    def __init__(self, root: str | Path, files: FileStore, run_request: RunRequest,
                 concurrency: int, is_ready: Callable[[], Awaitable[bool]]) -> None:
        """is_ready: waits until the engine serves; False if it never will (shutdown)."""
        self.folder = Path(root) / "batches"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.files = files
        self.run_request = run_request
        self.concurrency = max(1, concurrency)
        self.is_ready = is_ready
        self.batches: dict[str, dict[str, Any]] = {}
        self._jobs: dict[str, asyncio.Task] = {}
        self._inflight: dict[str, set[asyncio.Task]] = {}
        self.stopping = False
        for path in sorted(self.folder.glob("batch_*.json")):
            try:
                batch = json.loads(path.read_text())
            except ValueError as e:
                logger.warning("Ignoring unreadable batch %s: %s", path, e)
                continue
            self.batches[batch["id"]] = batch

    # ------------------------------------------------------------------ API

    def create(self, input_file_id: str, endpoint: str, metadata: dict[str, str] | None
               ) -> dict[str, Any]:
        """Accept a batch (raises BatchError, or LookupError for an unknown file)."""
        obj = self.files.get(input_file_id)
        if obj is None:
            raise LookupError(f"No such file: {input_file_id!r}")
        if obj.purpose != "batch":
            raise BatchError(f"File {input_file_id!r} has purpose {obj.purpose!r}; a batch "
                             f"needs a file uploaded with purpose 'batch'")
        batch = new_batch(input_file_id, endpoint, metadata)
        self.batches[batch["id"]] = batch
        self._save(batch)
        self._start(batch)
        return batch

    def get(self, batch_id: str) -> dict[str, Any] | None:
        return self.batches.get(batch_id)

    def page(self, after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
        """Newest first, after the batch `after` (a cursor); (page, has_more)."""
        ordered = sorted(self.batches.values(), key=lambda b: (b["created_at"], b["id"]),
                         reverse=True)
        if after is not None:
            ids = [b["id"] for b in ordered]
            if after not in ids:
                raise LookupError(f"No such batch: {after!r}")
            ordered = ordered[ids.index(after) + 1:]
        return ordered[:limit], len(ordered) > limit

    def cancel(self, batch_id: str) -> dict[str, Any]:
        """Stop a batch: unfinished requests are aborted, finished results kept."""
        batch = self.batches[batch_id]
        if batch["status"] in TERMINAL:
            raise BatchError(f"Batch {batch_id!r} is already {batch['status']}; only a "
                             f"validating or in-progress batch can be cancelled")
        if batch["status"] != "cancelling":
            batch["status"] = "cancelling"
            batch["cancelling_at"] = _now()
            self._save(batch)
            for task in list(self._inflight.get(batch_id, ())):
                task.cancel()
        if batch_id not in self._jobs:  # not running (e.g. before start-up finished)
            self._start(batch)
        return batch

    def is_input_of_active_batch(self, file_id: str) -> str | None:
        for batch in self.batches.values():
            if batch["input_file_id"] == file_id and batch["status"] not in TERMINAL:
                return str(batch["id"])
        return None

    # ------------------------------------------------------------------ lifetime

    def start(self) -> None:
        """Resume every unfinished batch (call from the running loop)."""
        for batch in self.batches.values():
            if batch["status"] not in TERMINAL:
                self._start(batch)

    async def stop(self) -> None:
        """On shutdown: stop running, keep what is done (resumed at the next start)."""
        self.stopping = True
        jobs = list(self._jobs.values())
        for task in jobs:
            task.cancel()
        for task in jobs:
            with contextlib.suppress(BaseException):
                await task

    def _start(self, batch: dict[str, Any]) -> None:
        task = asyncio.create_task(self._run(batch))
        self._jobs[batch["id"]] = task
        task.add_done_callback(lambda _: self._jobs.pop(batch["id"], None))

    # ------------------------------------------------------------------ running

    async def _run(self, batch: dict[str, Any]) -> None:
        try:
            if not await self.is_ready():
                return
            if batch["status"] == "cancelling":
                self._finish(batch, "cancelled")
                return
            lines = self._read_input(batch)
            if lines is None:
                return
            batch["status"] = "in_progress"
            batch["in_progress_at"] = batch["in_progress_at"] or _now()
            self._save(batch)
            await self._run_lines(batch, lines)
            if self.stopping:
                return
            if batch["status"] == "cancelling":
                self._finish(batch, "cancelled")
            elif _now() >= batch["expires_at"]:
                self._expire(batch, lines)
            else:
                self._finish(batch, "completed")
        except asyncio.CancelledError:
            raise
        except StorageFull as e:
            self._fail(batch, "storage_full", str(e))
        except Exception as e:  # noqa: BLE001 - a batch fails alone, never the server
            logger.exception("Batch %s failed", batch["id"])
            self._fail(batch, "internal_error", f"{type(e).__name__}: {e}")

    def _read_input(self, batch: dict[str, Any]) -> list[str] | None:
        """The input's request lines (blank lines skipped), or None after failing the batch."""
        file_id = batch["input_file_id"]
        if self.files.get(file_id) is None:
            self._fail(batch, "file_not_found", f"The input file {file_id!r} was deleted")
            return None
        text = self.files.read(file_id).decode("utf-8", errors="replace")
        lines = [line for line in text.splitlines() if line.strip()]
        if not lines:
            self._fail(batch, "empty_file", "The input file has no requests")
            return None
        if len(lines) > MAX_REQUESTS_PER_BATCH:
            self._fail(batch, "too_many_requests", f"The input file has {len(lines)} requests; "
                       f"a batch takes at most {MAX_REQUESTS_PER_BATCH}")
            return None
        batch["request_counts"]["total"] = len(lines)
        return lines

    async def _run_lines(self, batch: dict[str, Any], lines: list[str]) -> None:
        done = self._done_lines(batch["id"])
        inflight = self._inflight.setdefault(batch["id"], set())
        slots = asyncio.Semaphore(self.concurrency)
        try:
            for index, line in enumerate(lines):
                if index in done:
                    continue
                await slots.acquire()
                if batch["status"] == "cancelling" or self.stopping or \
                        _now() >= batch["expires_at"]:
                    slots.release()
                    break
                task = asyncio.create_task(self._run_line(batch, index, line))
                inflight.add(task)
                task.add_done_callback(lambda t: _release(inflight, t, slots))
            while inflight:
                await asyncio.wait(set(inflight))
        finally:
            for task in list(inflight):
                task.cancel()
            self._inflight.pop(batch["id"], None)

    async def _run_line(self, batch: dict[str, Any], index: int, line: str) -> None:
        parsed = parse_line(line, index, batch["endpoint"])
        if isinstance(parsed, dict):  # an error entry
            self._record(batch, index, parsed, ok=False)
            return
        custom_id, body = parsed
        rid = f"{batch['id']}-{index}"
        status, answer = await self.run_request(batch["endpoint"], body, rid)
        if self.stopping:
            return  # cut short by the shutdown: run again after the restart
        entry = {"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": custom_id,
                 "response": {"status_code": status, "request_id": rid, "body": answer},
                 "error": None}
        self._record(batch, index, entry, ok=200 <= status < 300)

    def _record(self, batch: dict[str, Any], index: int, entry: dict[str, Any], ok: bool
                ) -> None:
        data = (json.dumps(entry, ensure_ascii=False) + "\n").encode()
        self.files.check_room(len(data) + self._pending_bytes(batch["id"]))
        kind = "output" if ok else "errors"
        with open(self.folder / f"{batch['id']}.{kind}.jsonl", "ab") as f:
            f.write(data)
        with open(self.folder / f"{batch['id']}.done", "a") as f:
            f.write(f"{index}\n")
        batch["request_counts"]["completed" if ok else "failed"] += 1
        self._save(batch)

    def _expire(self, batch: dict[str, Any], lines: list[str]) -> None:
        done = self._done_lines(batch["id"])
        for index, line in enumerate(lines):
            if index not in done:
                custom_id = _custom_id_of(line)
                self._record(batch, index, error_entry(
                    custom_id, "batch_expired",
                    "This request could not be executed before the completion window "
                    "expired."), ok=False)
        self._finish(batch, "expired")

    # ------------------------------------------------------------------ ending

    def _finish(self, batch: dict[str, Any], status: str) -> None:
        if status == "completed":
            batch["status"] = "finalizing"
            batch["finalizing_at"] = _now()
            self._save(batch)
        for kind, key in (("output", "output_file_id"), ("errors", "error_file_id")):
            path = self.folder / f"{batch['id']}.{kind}.jsonl"
            if path.is_file() and batch[key] is None:
                name = f"{batch['id']}_{'output' if kind == 'output' else 'error'}.jsonl"
                batch[key] = self.files.adopt(path, name, "batch_output").id
        (self.folder / f"{batch['id']}.done").unlink(missing_ok=True)
        batch["status"] = status
        batch[f"{status}_at"] = _now()
        self._save(batch)
        logger.info("Batch %s %s: %s", batch["id"], status, batch["request_counts"])

    def _fail(self, batch: dict[str, Any], code: str, message: str) -> None:
        batch["errors"] = {"object": "list",
                           "data": [{"code": code, "message": message, "param": None,
                                     "line": None}]}
        self._finish(batch, "failed")

    # ------------------------------------------------------------------ files

    def _done_lines(self, batch_id: str) -> set[int]:
        path = self.folder / f"{batch_id}.done"
        if not path.is_file():
            return set()
        return {int(x) for x in path.read_text().split() if x.isdigit()}

    def _pending_bytes(self, batch_id: str) -> int:
        """Result bytes written but not yet in the FileStore."""
        return sum(p.stat().st_size for p in self.folder.glob(f"{batch_id}.*.jsonl"))

    def _save(self, batch: dict[str, Any]) -> None:
        path = self.folder / f"{batch['id']}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(batch))
        tmp.replace(path)


def _release(inflight: set[asyncio.Task], task: asyncio.Task, slots: asyncio.Semaphore
             ) -> None:
    inflight.discard(task)
    slots.release()


# ---------------------------------------------------------------- input lines


def error_entry(custom_id: str | None, code: str, message: str) -> dict[str, Any]:
    return {"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": custom_id,
            "response": None, "error": {"code": code, "message": message}}


def _custom_id_of(line: str) -> str | None:
    try:
        value = json.loads(line).get("custom_id")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def parse_line(line: str, index: int, endpoint: str
               ) -> tuple[str | None, dict[str, Any]] | dict[str, Any]:
    """(custom_id, body) of a valid request line, else its error entry."""
    where = f"Line {index + 1}"
    try:
        req = json.loads(line)
    except ValueError as e:
        return error_entry(None, "invalid_json_line", f"{where} is not valid JSON: {e}")
    if not isinstance(req, dict):
        return error_entry(None, "invalid_json_line", f"{where} is not a JSON object")
    custom_id = req.get("custom_id")
    cid = custom_id if isinstance(custom_id, str) else None
    problems = []
    if not isinstance(custom_id, str):
        problems.append("'custom_id' must be a string")
    if req.get("method", "POST") != "POST":
        problems.append(f"'method' must be 'POST', not {req.get('method')!r}")
    if req.get("url") != endpoint:
        problems.append(f"'url' is {req.get('url')!r}, but this batch's endpoint is {endpoint!r}")
    if not isinstance(req.get("body"), dict):
        problems.append("'body' must be a JSON object")
    if problems:
        return error_entry(cid, "invalid_request", f"{where}: " + "; ".join(problems))
    return cid, req["body"]
