"""The Anthropic Messages API: POST /v1/messages and /v1/messages/count_tokens.

    POST /v1/messages               a message (Anthropic's `message` object), or with
                                    `stream: true` its server-sent events (stream.py)
    POST /v1/messages/count_tokens  {"input_tokens": N}: the prompt as the model sees it

A request is translated into an OpenAI chat request (translate.py) and runs
through the OpenAI layer's `prepare_chat`: the same template, tool prompt,
tool-call grammar (tool_choice any / tool: a call always parses, as on the
OpenAI routes), reasoning parser and validation. The output comes back as
content blocks: `thinking` (the reasoning parser's think block), `text`, then
`tool_use` per call (its `input` an object; a call cut by max_tokens, whose
arguments are not a whole JSON object, is dropped).

- `stop_reason`: "tool_use" (the answer called), "max_tokens", "stop_sequence"
  (with `stop_sequence`: which of the request's it was), else "end_turn".
- `usage`: `input_tokens` (the prompt less its cached part),
  `cache_read_input_tokens` (the prefix cache's hit), `output_tokens`.
- `max_tokens` past what the context leaves is capped there (clients such as
  Claude Code send 32000 whatever the model).
- Headers: `x-api-key` is accepted for `--api-key` (http/middleware.py);
  `anthropic-version` must be a date (YYYY-MM-DD) when given, `anthropic-beta`
  is accepted. Errors have Anthropic's shape (http/error_shapes.py).
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.responses import Response

from radixlm.entrypoints.anthropic.protocol import CountTokensRequest, MessagesRequest
from radixlm.entrypoints.anthropic.response import message_body
from radixlm.entrypoints.anthropic.stream import stream_message
from radixlm.entrypoints.anthropic.translate import chat_request_dict
from radixlm.entrypoints.http.errors import APIError, JSONResponse, validation_error
from radixlm.entrypoints.http.state import ServerState, state_of
from radixlm.entrypoints.http.utils import parse_body
from radixlm.entrypoints.openai.protocol import ChatCompletionRequest
from radixlm.entrypoints.openai.serving_chat import ChatJob, prepare_chat, run_chat
from radixlm.entrypoints.openai.utils import new_id

router = APIRouter(prefix="/v1")

_VERSION_RE = re.compile(r"\d{4}-\d{2}-\d{2}")


@router.post("/messages")
async def messages(request: Request) -> Response:
    return await create_message(request, state_of(request))


@router.post("/messages/count_tokens")
async def count_tokens(request: Request) -> Response:
    state = state_of(request)
    state.tokenizer_engine("/v1/messages/count_tokens")
    check_version(request)
    req = await parse_body(request, CountTokensRequest)
    thinks = state.agents is not None and state.agents.reasoning_parser is not None
    job = await prepare_chat(state, chat_request(chat_request_dict(req, thinks=thinks)))
    return JSONResponse({"input_tokens": len(job.obj.input_ids or [])})


def check_version(request: Request) -> None:
    version = request.headers.get("anthropic-version")
    if version is not None and not _VERSION_RE.fullmatch(version.strip()):
        raise APIError(f"anthropic-version: {version!r} is not a valid version (a date such "
                       "as 2023-06-01)", param="anthropic-version")


def chat_request(body: dict[str, Any]) -> ChatCompletionRequest:
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        raise validation_error(e) from e


async def create_message(request: Request, state: ServerState) -> Response:
    tm = state.engine()
    check_version(request)
    req = await parse_body(request, MessagesRequest)
    thinks = state.agents is not None and state.agents.reasoning_parser is not None
    job = await prepare_chat(state, chat_request(chat_request_dict(req, req.stream, thinks)))
    cap_to_context(job, state.context_length)
    msg_id = new_id("msg").replace("-", "_")
    model = req.model
    if req.stream:
        return await stream_message(request, tm, req, job, msg_id)
    outs = await run_chat(request, tm, job)  # with tools: ended at a repeated call
    return JSONResponse(message_body(outs[0], req, job, msg_id, model))


def cap_to_context(job: ChatJob, context_length: int) -> None:
    """max_tokens past the context: up to the end of the context instead of a 400."""
    params = job.obj.sampling_params
    assert isinstance(params, dict)
    wanted = params.get("max_new_tokens")
    num_prompt = len(job.obj.input_ids or [])
    if context_length and wanted is not None and num_prompt + wanted > context_length:
        params["max_new_tokens"] = None  # the runtime fills in the rest of the context
