"""Runtime control routes (SGLang's names and shapes). POST only.

    POST /update_weights_from_disk  {"model_path", "load_format", "abort_all_requests"}
                                    → {"success", "message", "num_paused_requests"}; 400
                                    (the served weights kept) for a checkpoint of another
                                    architecture or other shapes
    POST /start_profile             {"output_dir", "num_steps", "activities",
                                    "record_shapes", "with_stack", "profile_id"} (all
                                    optional) → "Start profiling.\n"
    POST /stop_profile              writes the trace → "Stop profiling. ...\n"

A weight update lets the requests in flight finish first (new ones wait), as
SGLang does; with `abort_all_requests` they are aborted instead. The prefix
cache is flushed with the new weights.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import PlainTextResponse, Response

from radixlm.entrypoints.http.errors import APIError, JSONResponse, error_body
from radixlm.entrypoints.http.state import state_of
from radixlm.entrypoints.http.utils import parse_body, read_json
from radixlm.messages.io_struct import ProfileReq
from radixlm.scheduler.profiler import MAX_PROFILE_STEPS

router = APIRouter()


class UpdateWeightsRequest(BaseModel):
    # NOTE: SGLang's other fields (weight_version, is_async, flush_cache, ...) are
    # accepted and ignored: the cache is always flushed, the update always synchronous.
    model_config = ConfigDict(extra="ignore", strict=True)

    model_path: str = Field(min_length=1)
    load_format: str | None = None
    abort_all_requests: bool = False


class ProfileRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    output_dir: str | None = None
    num_steps: int | None = Field(None, ge=1, le=MAX_PROFILE_STEPS)
    activities: list[str] | None = None
    record_shapes: bool = False
    with_stack: bool = False
    profile_id: str | None = None


@router.post("/update_weights_from_disk")
async def update_weights_from_disk(request: Request) -> Response:
    tm = state_of(request).engine()
    body = await parse_body(request, UpdateWeightsRequest)
    reply = await tm.update_weights_from_disk(body.model_path, body.load_format,
                                              body.abort_all_requests)
    body_out = {"success": reply.success, "message": reply.message,
                "num_paused_requests": reply.num_paused_requests}
    if not reply.success:  # SGLang's fields, plus the OpenAI error body's
        body_out.update(error_body(reply.message, 400, param="model_path"))
    return JSONResponse(body_out, status_code=200 if reply.success else 400)


async def _profile_body(request: Request) -> ProfileRequest:
    if not (await request.body()).strip():
        return ProfileRequest.model_validate({})
    await read_json(request)  # a clear 400 for malformed JSON
    return await parse_body(request, ProfileRequest)


@router.post("/start_profile")
async def start_profile(request: Request) -> Response:
    tm = state_of(request).engine()
    body = await _profile_body(request)
    reply = await tm.profile(ProfileReq("start", **body.model_dump()))
    if not reply.success:
        raise APIError(reply.message)
    return PlainTextResponse(f"Start profiling. The trace will be written to "
                             f"{reply.trace_path}\n")


@router.post("/stop_profile")
async def stop_profile(request: Request) -> Response:
    tm = state_of(request).engine()
    reply = await tm.profile(ProfileReq("stop"))
    if not reply.success:
        raise APIError(reply.message)
    return PlainTextResponse(f"Stop profiling. {reply.message}\n")
