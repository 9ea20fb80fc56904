"""The OpenAI Files and Batch routes (storage in file_store.py, jobs in batch_manager.py).

    POST   /v1/files                  multipart `file` + `purpose` ("batch") → File
    GET    /v1/files                  {"object": "list", "data": [File...]} (?purpose=)
    GET    /v1/files/{id}             File
    GET    /v1/files/{id}/content     the bytes
    DELETE /v1/files/{id}             {"id", "object": "file", "deleted": true}
    POST   /v1/batches                {"input_file_id", "endpoint", "completion_window": "24h",
                                       "metadata"} → Batch
    GET    /v1/batches                ?after=&limit= → {"object": "list", "data", "first_id",
                                       "last_id", "has_more"}
    GET    /v1/batches/{id}           Batch
    POST   /v1/batches/{id}/cancel    Batch (status "cancelling", then "cancelled")

A batch's lines run through the same handlers as the online routes
(`run_in_process`), as background traffic.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import UploadFile
from starlette.responses import Response

from radixlm.entrypoints.http.errors import APIError, JSONResponse, validation_error
from radixlm.entrypoints.http.state import ServerState
from radixlm.entrypoints.http.utils import parse_body
from radixlm.entrypoints.openai.batch_manager import BatchError, BatchManager
from radixlm.entrypoints.openai.file_store import FileStore, StorageFull
from radixlm.tokenizer.tokenizer_manager import background_traffic

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/v1")

FILE_PURPOSES = ("batch",)
Handler = Callable[[Request, ServerState], Awaitable[Response]]


def _files(request: Request) -> FileStore:
    return request.app.state.files  # type: ignore[no-any-return]


def _batches(request: Request) -> BatchManager:
    return request.app.state.batches  # type: ignore[no-any-return]


def _not_found(kind: str, item_id: str, param: str) -> APIError:
    return APIError(f"No such {kind}: {item_id!r}", 404, param=param, code="not_found")


# ---------------------------------------------------------------- files


@router.post("/files")
async def create_file(request: Request) -> Response:
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise APIError("Upload the file as multipart/form-data with the fields 'file' and "
                       "'purpose'")
    try:
        form = await request.form(max_files=1, max_fields=4)
    except Exception as e:  # noqa: BLE001 - starlette raises several kinds for a bad body
        raise APIError(f"Malformed multipart body: {e}") from e
    purpose = form.get("purpose")
    upload = form.get("file")
    if not isinstance(purpose, str):
        raise APIError("Missing form field 'purpose'", param="purpose")
    if purpose not in FILE_PURPOSES:
        raise APIError(f"Unsupported purpose {purpose!r}; this server stores files with "
                       f"purpose {', '.join(repr(p) for p in FILE_PURPOSES)}", param="purpose")
    if not isinstance(upload, UploadFile):
        raise APIError("Missing form field 'file' (a file part)", param="file")
    data = await upload.read()
    await upload.close()
    filename = upload.filename or "upload.jsonl"
    try:
        obj = await asyncio.to_thread(_files(request).create, data, filename, purpose)
    except StorageFull as e:
        raise APIError(str(e), 413, code="storage_full") from e
    return JSONResponse(obj.to_json())


@router.get("/files")
async def list_files(request: Request, purpose: str | None = None) -> Response:
    data = [f.to_json() for f in _files(request).all(purpose)]
    return JSONResponse({"object": "list", "data": data, "has_more": False})


@router.get("/files/{file_id}")
async def retrieve_file(file_id: str, request: Request) -> Response:
    obj = _files(request).get(file_id)
    if obj is None:
        raise _not_found("file", file_id, "file_id")
    return JSONResponse(obj.to_json())


@router.get("/files/{file_id}/content")
async def file_content(file_id: str, request: Request) -> Response:
    store = _files(request)
    obj = store.get(file_id)
    if obj is None:
        raise _not_found("file", file_id, "file_id")
    data = await asyncio.to_thread(store.read, file_id)
    return Response(data, media_type="application/octet-stream")


@router.delete("/files/{file_id}")
async def delete_file(file_id: str, request: Request) -> Response:
    store = _files(request)
    if store.get(file_id) is None:
        raise _not_found("file", file_id, "file_id")
    active = _batches(request).is_input_of_active_batch(file_id)
    if active is not None:
        raise APIError(f"File {file_id!r} is the input of batch {active!r}, which is still "
                       f"running; cancel it first", param="file_id")
    await asyncio.to_thread(store.delete, file_id)
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})


# ---------------------------------------------------------------- batches


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = Field(None, max_length=16)


@router.post("/batches")
async def create_batch(request: Request) -> Response:
    state: ServerState = request.app.state.server
    body = await parse_body(request, BatchRequest)
    endpoints = batch_endpoints(state)
    if body.endpoint not in endpoints:
        raise APIError(f"Unsupported endpoint {body.endpoint!r}; this server runs batches for "
                       f"{', '.join(endpoints)}", param="endpoint")
    if body.completion_window != "24h":
        raise APIError("'completion_window' must be '24h'", param="completion_window")
    try:
        batch = _batches(request).create(body.input_file_id, body.endpoint, body.metadata)
    except LookupError as e:
        raise APIError(str(e), 404, param="input_file_id", code="not_found") from e
    except BatchError as e:
        raise APIError(str(e), param="input_file_id") from e
    return JSONResponse(batch)


@router.get("/batches")
async def list_batches(request: Request, after: str | None = None, limit: int = 20) -> Response:
    if not 1 <= limit <= 100:
        raise APIError("'limit' must be between 1 and 100", param="limit")
    try:
        page, has_more = _batches(request).page(after, limit)
    except LookupError as e:
        raise APIError(str(e), 404, param="after", code="not_found") from e
    return JSONResponse({"object": "list", "data": page,
                         "first_id": page[0]["id"] if page else None,
                         "last_id": page[-1]["id"] if page else None, "has_more": has_more})


@router.get("/batches/{batch_id}")
async def retrieve_batch(batch_id: str, request: Request) -> Response:
    batch = _batches(request).get(batch_id)
    if batch is None:
        raise _not_found("batch", batch_id, "batch_id")
    return JSONResponse(batch)


@router.post("/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, request: Request) -> Response:
    manager = _batches(request)
    if manager.get(batch_id) is None:
        raise _not_found("batch", batch_id, "batch_id")
    try:
        return JSONResponse(manager.cancel(batch_id))
    except BatchError as e:
        raise APIError(str(e), 409, code="batch_not_cancellable") from e


# ---------------------------------------------------------------- running a line


def batch_endpoints(state: ServerState) -> dict[str, Handler]:
    """The routes a batch may target on this server (generation or embedding)."""
    from radixlm.entrypoints.openai.serving_chat import create_chat_completion
    from radixlm.entrypoints.openai.serving_completions import create_completion
    from radixlm.entrypoints.openai.serving_embedding import create_embedding

    if not state.is_generation:
        return {"/v1/embeddings": create_embedding}
    return {"/v1/chat/completions": create_chat_completion, "/v1/completions": create_completion}


def _internal_request(app: Any, path: str, body: bytes) -> Request:
    """A Starlette request that carries `body` and never disconnects."""
    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "scheme": "http", "http_version": "1.1",
             "headers": [(b"content-type", b"application/json")], "app": app,
             "client": ("batch", 0), "server": ("batch", 0)}
    sent = False
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()  # a batch request ends only by finishing or by cancellation
        return {"type": "http.disconnect"}

    return Request(scope, receive)


def _openai_error(e: APIError) -> dict[str, Any]:
    """The error body OpenAI writes in a batch's error file."""
    return {"error": {"message": e.message, "type": e.err_type, "param": e.param,
                      "code": e.code}}


def run_in_process(app: Any, state: ServerState
                   ) -> Callable[[str, dict[str, Any], str], Awaitable[tuple[int, dict[str, Any]]]]:
    """The batch manager's RunRequest: call the route's handler in this process."""

    async def run(url: str, body: dict[str, Any], rid: str) -> tuple[int, dict[str, Any]]:
        handler = batch_endpoints(state).get(url)
        if handler is None:
            return 400, _openai_error(APIError(f"Unsupported endpoint {url!r}"))
        if body.get("stream"):
            return 400, _openai_error(APIError("Streaming is not supported in a batch",
                                               param="stream"))
        request = _internal_request(app, url, orjson.dumps({**body, "rid": rid}))
        try:
            with background_traffic():
                response = await handler(request, state)
        except APIError as e:
            return e.status_code, _openai_error(e)
        except ValidationError as e:
            return 400, _openai_error(validation_error(e))
        except Exception as e:  # noqa: BLE001 - one line fails, the batch goes on
            logger.exception("Batch request %s failed", rid)
            return 500, _openai_error(APIError(f"Internal server error: {type(e).__name__}", 500))
        return response.status_code, orjson.loads(bytes(response.body))

    return run
