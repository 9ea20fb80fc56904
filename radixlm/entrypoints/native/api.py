"""The native (SGLang-style) routes.

    POST /generate          text | input_ids, single or batch; streams with `stream`;
                            images and videos in `image_data` / `video_data`
    GET  /health            200 while serving, 503 while loading, draining or dead (HEAD too)
    GET  /health_generate   generates one token (503 if the scheduler is dead or stuck)
    GET  /get_model_info    model path, context length, vocabulary, image/video input, ...
                            (also /model_info, SGLang's newer name)
    GET  /get_server_info   server args + scheduler state (free/used KV tokens, ...)
                            (also /server_info)
    GET  /get_load          SGLang's load list (one entry per --dp-size replica)
    POST /flush_cache       empty the prefix cache (400 while requests run)
    POST /abort_request     {"rid": ...} or {"abort_all": true}
    GET  /metrics           with --enable-metrics
    POST /encode, /classify a pooling model's vectors / label logits (serving_embedding.py)

/generate answers one output dict (`text`, `output_ids`, `meta_info`, `index`)
for a single prompt with n == 1, else a list of them in prompt-major order;
a stream sends `data: {...}` per new piece of text (cumulative `text`,
`output_ids` and logprobs as SGLang sends them, and the new `delta`; with
--incremental-streaming-output only what is new) and ends with `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from pydantic import ConfigDict, model_validator
from starlette.responses import Response

from radixlm import __version__
from radixlm.entrypoints.http.errors import APIError, JSONResponse
from radixlm.entrypoints.http.state import ServerState, state_of
from radixlm.entrypoints.http.strict import StrictModel
from radixlm.entrypoints.http.utils import collect, parse_body, sse, sse_stream
from radixlm.messages.generate_output import GenerateOutput, SampleDicts, final_dict, token_only
from radixlm.messages.io_struct import is_sample_of
from radixlm.metrics import CONTENT_TYPE
from radixlm.reasoning.split import ReasoningSplitter
from radixlm.tokenizer.request_input import GenerateReqInput

logger = logging.getLogger(__name__)
router = APIRouter()

HEALTH_GENERATE_TIMEOUT = 20.0  # seconds (at most --watchdog-timeout)


class GenerateRequest(StrictModel):
    """POST /generate body (see GenerateReqInput for the batch rules). The sampling
    parameters are checked, as strictly, by SamplingParams.from_dict."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] = False
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    return_text_in_logprobs: bool = True
    return_hidden_states: bool | list[bool] = False
    stream: bool = False
    log_metrics: bool = True  # SGLang's; sglang-router sends it (metrics are per server here)
    # Sources as strings, nested per prompt and per video: see request_input.py. A wrong
    # shape or type is a 400 from the media loader, which names the problem.
    image_data: str | list[Any] | None = None
    video_data: str | list[Any] | None = None
    # With --reasoning-parser: also return the think block and the answer apart
    # (`reasoning_content`, `content`; stream events: their deltas). `text` stays raw.
    separate_reasoning: bool = False
    priority: int | list[int] | None = None  # with --enable-priority-scheduling

    @model_validator(mode="before")
    @classmethod
    def _drop_unknown_fields(cls, data: Any) -> Any:
        # NOTE: as SGLang does, fields this server does not know (lora_path, custom_logit_processor,
        # ...) are ignored with a debug log; unknown *sampling* parameters stay an error
        # (SamplingParams.from_dict), and the known fields keep their strict types.
        if isinstance(data, dict):
            unknown = sorted(k for k in data if k not in cls.model_fields)
            if unknown:
                logger.debug("/generate: ignoring unknown field(s): %s", ", ".join(unknown))
                return {k: v for k, v in data.items() if k in cls.model_fields}
        return data


class AbortRequest(StrictModel):
    model_config = ConfigDict(extra="forbid")

    rid: str | None = None
    abort_all: bool = False


def reasoning_splitter(state: ServerState, body: GenerateRequest) -> ReasoningSplitter:
    """What separate_reasoning adds to /generate's dicts; 400 without a reasoning parser."""
    name = state.args.reasoning_parser if body.separate_reasoning else None
    if body.separate_reasoning and name is None:
        raise APIError("separate_reasoning needs a reasoning parser (--reasoning-parser)",
                       param="separate_reasoning")
    prompts = [body.text] if isinstance(body.text, str) else list(body.text or [])
    params = body.sampling_params
    per_prompt = params if isinstance(params, list) else [params or {}] * max(len(prompts), 1)
    num_samples = [int(p.get("n", 1)) if isinstance(p.get("n", 1), int) else 1
                   for p in per_prompt]
    return ReasoningSplitter(name, prompts, num_samples)


@router.post("/generate")
async def generate(request: Request) -> Response:
    state = state_of(request)
    tm = state.engine()
    body = await parse_body(request, GenerateRequest)
    obj = GenerateReqInput(**body.model_dump(exclude={"separate_reasoning", "log_metrics"}))
    obj.default_prompt_logprobs()
    split = reasoning_splitter(state, body)
    if not obj.stream:
        outs = await collect(request, tm.generate(obj))
        single = not obj.is_batch and len(outs) == 1
        no_text = tm.tokenizer is None  # --skip-tokenizer-init
        dicts = [token_only(split.whole(o.index, final_dict(o)), no_text) for o in outs]
        return JSONResponse(dicts[0] if single else dicts)
    incremental = state.args.incremental_streaming_output
    samples: dict[int, SampleDicts] = {}

    def on_output(out: GenerateOutput) -> list[bytes]:
        sample = samples.get(out.index)
        if sample is None:
            # NOTE: copy=False: each event is serialized before the next output arrives.
            sample = samples[out.index] = SampleDicts(incremental, copy=False)
        return [sse(token_only(split.delta(out, sample.add(out)), tm.tokenizer is None))]

    return await sse_stream(request, tm.generate(obj), on_output)


@router.post("/encode")
async def encode(request: Request) -> Response:
    from radixlm.entrypoints.openai.serving_embedding import encode as encode_handler

    return await encode_handler(request, state_of(request))


@router.post("/classify")
async def classify(request: Request) -> Response:
    from radixlm.entrypoints.openai.serving_embedding import encode as encode_handler

    return await encode_handler(request, state_of(request), "/classify")


@router.api_route("/health", methods=["GET", "HEAD"])
async def health(request: Request) -> Response:
    reason = state_of(request).unhealthy_reason()
    if reason is not None:
        raise APIError(reason, 503)
    return Response(status_code=200)


@router.get("/health_generate")
async def health_generate(request: Request) -> Response:
    """Healthy when the scheduler answers: a one-token generate finishes, or (when it is
    busy) any output arrives while we wait."""
    state = state_of(request)
    tm = state.engine()
    if state.is_stuck():
        raise APIError("The scheduler has not made progress within --watchdog-timeout", 503)
    timeout = min(HEALTH_GENERATE_TIMEOUT, state.args.watchdog_timeout)
    started = time.monotonic()
    obj = GenerateReqInput(input_ids=[0], rid=f"health-{uuid.uuid4().hex}",
                           sampling_params={"max_new_tokens": 1, "temperature": 0.0})

    async def run() -> None:
        async for _ in tm.generate(obj):
            pass

    task = asyncio.ensure_future(run())
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=0.1)
            if tm.last_receive_time > started:
                break  # the scheduler answered (this request or others): alive
            if time.monotonic() - started > timeout:
                raise APIError(f"The scheduler did not answer a one-token request in {timeout:g} s",
                               503)
        if task.done() and task.exception() is not None:
            raise APIError(f"The health check request failed: {task.exception()}", 503)
    finally:
        if not task.done():
            task.cancel()
    return Response(status_code=200)


@router.get("/get_model_info")
async def get_model_info(request: Request) -> Response:
    state = state_of(request)
    tm = state.engine()
    args = state.args
    # NOTE: the path or id the user gave (clients such as SGLang's frontend pick a chat
    # template from it), not the folder a GGUF was converted into.
    # (tm.model_path follows weight updates; without --model-path it is the folder the
    # packaged default GGUF was converted into.)
    model_path = (tm.model_path if tm.model_path != tm.model_dir
                  else _default_model_path(tm.model_dir))
    return JSONResponse({
        "model_path": model_path,
        "tokenizer_path": args.tokenizer_path or model_path,
        "served_model_name": state.model_name,
        "is_generation": True,
        "chat_template": state.chat_template.name if state.chat_template else None,
        # SGLang's name; the playground shows its image control only when it is true.
        "has_image_understanding": tm.mm_processor.image_token is not None,
        "has_video_understanding": tm.mm_processor.video_token is not None,
        **tm.model_info,
    })


def _default_model_path(fallback: str) -> str:
    from radixlm.default_model import default_model_path

    try:
        return default_model_path()
    except FileNotFoundError:
        return fallback


@router.get("/get_server_info")
async def get_server_info(request: Request) -> Response:
    state = state_of(request)
    tm = state.engine()
    info = await tm.get_server_info()
    args = dataclasses.asdict(state.args)
    args.pop("api_key", None)
    return JSONResponse({**args, **info, "version": __version__})


@router.get("/get_load")
async def get_load(request: Request) -> Response:
    """SGLang's load report, one entry per data-parallel replica (sglang-router polls it)."""
    info = await state_of(request).engine().get_server_info()
    replicas = info.get("replicas") or [info]
    return JSONResponse([{
        "dp_rank": i,
        "num_reqs": int(r.get("num_running_reqs", 0)) + int(r.get("num_waiting_reqs", 0)),
        "num_waiting_reqs": int(r.get("num_waiting_reqs", 0)),
        "num_tokens": int(r.get("num_used_tokens", 0)),
    } for i, r in enumerate(replicas)])


@router.post("/flush_cache")
async def flush_cache(request: Request) -> Response:
    result = await state_of(request).engine().flush_cache()
    if not result.success:
        raise APIError(result.message or "Cannot flush the cache while requests are running")
    return JSONResponse({"success": True, "message": result.message or "Cache flushed"})


@router.post("/abort_request")
async def abort_request(request: Request) -> Response:
    tm = state_of(request).engine()
    body = await parse_body(request, AbortRequest)
    if body.abort_all:
        tm.abort_request(abort_all=True, message="Aborted by POST /abort_request")
    elif body.rid:
        rids = [r for r in list(tm.states) if is_sample_of(r, body.rid)]
        for rid in rids or [body.rid]:
            tm.abort_request(rid, message="Aborted by POST /abort_request")
    else:
        raise APIError("Give 'rid' or 'abort_all': true", param="rid")
    return JSONResponse({"success": True})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = state_of(request)
    if state.metrics is None:
        raise APIError("Metrics are disabled; start the server with --enable-metrics", 404)
    if state.unhealthy_reason() is None:
        state.metrics.update_from_server_info(await state.tm.get_server_info())
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)
