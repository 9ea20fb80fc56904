"""POST /api/chat and /api/generate: Ollama requests run through the OpenAI layer.

- Both stream by default (NDJSON, `application/x-ndjson`: one object per line);
  `"stream": false` answers one object. A failure mid-stream is a line
  `{"error": "..."}` and the stream ends there.
- /api/chat and /api/generate (not raw) become an OpenAI chat request
  (translate.py) and run through `prepare_chat`: the chat template, tools
  (grammar-forced exactly as on the OpenAI routes), `format` as the request's
  grammar, the reasoning parser (`think`; `thinking` in the answer).
- /api/generate with `raw: true`: the prompt as it is, tokenized as
  /v1/completions does. `context` (the ids an earlier answer returned) goes
  before the prompt; every non-raw answer returns its `context`.
- `options.num_ctx`: larger than the server's context is a 400; smaller makes
  the request's own context (the prompt must fit in it, and the answer ends
  at its end). Without `num_predict` (or -1, -2) an answer may run to the end
  of the context.
- `think` without --reasoning-parser is a 400 (Ollama's "does not support
  thinking"); an empty `messages` / `prompt` loads the model (`done_reason`
  "load"), as Ollama answers it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from radixlm.entrypoints.http.errors import APIError, JSONResponse, validation_error
from radixlm.entrypoints.http.state import ServerState
from radixlm.entrypoints.http.utils import aclose, all_outputs, collect, open_stream, parse_body
from radixlm.entrypoints.ollama.protocol import ChatRequest, GenerateRequest, Options
from radixlm.entrypoints.ollama.reply import Reply, load_reply
from radixlm.entrypoints.ollama.translate import (
    chat_request_dict,
    generate_request_dict,
    sampling_fields,
)
from radixlm.entrypoints.openai.call_watch import merge_outputs
from radixlm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from radixlm.entrypoints.openai.serving_chat import ChatJob, prepare_chat, run_chat
from radixlm.entrypoints.openai.serving_completions import tokenize_prompts
from radixlm.entrypoints.openai.utils import new_id
from radixlm.messages.generate_output import GenerateOutput
from radixlm.tokenizer.request_input import GenerateReqInput

NDJSON = "application/x-ndjson"


async def chat(request: Request, state: ServerState) -> Response:
    start_ns = time.monotonic_ns()
    tm = state.tokenizer_engine("/api/chat")
    req = await parse_body(request, ChatRequest)
    if not req.messages:
        return JSONResponse(load_reply(req.model, True, req.keep_alive))
    check_think(state, req.model, req.think)
    job = await prepare_chat(state, _chat_request(chat_request_dict(req)))
    fit_context(job, req.options, state.context_length)
    reply = Reply(req.model, job, chat=True, start_ns=start_ns, tm=tm)
    return await _answer(request, tm, job, reply, req.stream)


async def generate(request: Request, state: ServerState) -> Response:
    start_ns = time.monotonic_ns()
    tm = state.tokenizer_engine("/api/generate")
    req = await parse_body(request, GenerateRequest)
    if not req.prompt and not req.images and not req.context:
        return JSONResponse(load_reply(req.model, False, req.keep_alive))
    if req.raw:
        if req.images or req.system:
            raise APIError("raw prompts take no images or system (they are not templated)")
        job = await _raw_job(state, req)
    else:
        check_think(state, req.model, req.think)
        job = await prepare_chat(state, _chat_request(generate_request_dict(req)))
        job.obj.input_ids = list(req.context or []) + _ids(job)
    fit_context(job, req.options, state.context_length)
    context_ids = None if req.raw else _ids(job)
    reply = Reply(req.model, job, chat=False, start_ns=start_ns, tm=tm,
                  context_ids=context_ids)
    return await _answer(request, tm, job, reply, req.stream)


def check_think(state: ServerState, model: str, think: bool | str | None) -> None:
    if think not in (None, False) and (state.agents is None
                                       or state.agents.reasoning_parser is None):
        raise APIError(f'"{model}" does not support thinking (start the server with '
                       "--reasoning-parser)", param="think")


def _chat_request(body: dict[str, Any]) -> ChatCompletionRequest:
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        raise validation_error(e) from e


def _ids(job: ChatJob) -> list[int]:
    ids = job.obj.input_ids
    assert ids is None or not ids or isinstance(ids[0], int)
    return list(ids or [])  # type: ignore[arg-type]


async def _raw_job(state: ServerState, req: GenerateRequest) -> ChatJob:
    """A raw prompt: tokenized as it is, no template, no parsers."""
    tm = state.tm
    fields = sampling_fields(req.options, req.format)
    max_tokens = fields.pop("max_tokens", None)
    try:
        creq = CompletionRequest.model_validate({"model": req.model, "prompt": req.prompt,
                                                 **fields})
    except ValidationError as e:
        raise validation_error(e) from e
    workers = tm.tokenizer_workers
    try:
        [(_, ids)] = await workers.run(tokenize_prompts, req.prompt or " ", workers,
                                       state.context_length or 1 << 30)
    except ValueError as e:
        raise APIError(str(e), param="prompt") from e
    ids = list(req.context or []) + (ids if req.prompt else [])
    obj = GenerateReqInput(input_ids=ids, sampling_params=creq.sampling_params(max_tokens),
                           rid=new_id("ollama"), stream=req.stream)
    return ChatJob(obj, None, None)


def fit_context(job: ChatJob, options: Options | None, context_length: int) -> None:
    """Apply `num_ctx` (see the module docstring); raise APIError(400) when it cannot."""
    num_ctx = options.num_ctx if options is not None else None
    if num_ctx is None:
        return
    if context_length and num_ctx > context_length:
        raise APIError(f"num_ctx ({num_ctx}) is larger than this server's context length "
                       f"({context_length})", param="options.num_ctx")
    num_prompt = len(_ids(job))
    if num_prompt >= num_ctx:
        raise APIError(f"The prompt ({num_prompt} tokens) does not fit in num_ctx ({num_ctx})",
                       param="options.num_ctx")
    params = job.obj.sampling_params
    assert isinstance(params, dict)
    room = num_ctx - num_prompt
    wanted = params.get("max_new_tokens")
    params["max_new_tokens"] = room if wanted is None else min(wanted, room)
    params["min_new_tokens"] = min(params.get("min_new_tokens") or 0, params["max_new_tokens"])


async def _answer(request: Request, tm: object, job: ChatJob, reply: Reply, stream: bool
                  ) -> Response:
    # NOTE: the runtime streams even a whole answer, so that the time of its first token
    # (prompt_eval_duration) is known: a non-streamed request reports only its end.
    job.obj.stream = True
    if not stream:
        if job.watched:  # with tools: ended at a repeated call or the call limit
            [whole] = await run_chat(request, tm, job)
        else:
            whole = merge_outputs(await collect(request, tm.generate(job.obj)))  # type: ignore[attr-defined]
        return JSONResponse(reply.whole(whole))
    return await ndjson_stream(request, tm.generate(job.obj), reply)  # type: ignore[attr-defined]


async def ndjson_stream(request: Request, outputs: AsyncIterator[GenerateOutput], reply: Reply
                        ) -> StreamingResponse:
    """One JSON object per line; errors before the first output are a plain HTTP error."""
    first = await open_stream(request, outputs)

    async def lines() -> AsyncGenerator[bytes, None]:
        rest = all_outputs(first, outputs)
        try:
            async for out in rest:
                if isinstance(out, APIError):
                    yield orjson.dumps({"error": out.message}) + b"\n"
                    break
                for chunk in reply.chunks(out):
                    yield orjson.dumps(chunk) + b"\n"
        finally:
            await aclose(rest)

    gen = lines()
    return StreamingResponse(gen, media_type=NDJSON, background=BackgroundTask(gen.aclose))
