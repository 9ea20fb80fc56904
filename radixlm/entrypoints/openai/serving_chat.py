"""POST /v1/chat/completions: messages → chat template → native generate → choices.

- Messages become the plain dicts Hugging Face templates expect: text content
  parts are joined into one string; image parts are refused (this model takes
  text only); "developer" is sent as "system".
- The prompt is the rendered template, tokenized without adding special
  tokens (the template already holds them). Without max_tokens a reply may
  run to the end of the context.
- Streaming: each choice's first chunk carries `role`, later chunks the new
  content, and its last chunk the one `finish_reason` (and `matched_stop`);
  `stream_options.include_usage` adds a final chunk with `usage` and no choices.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from radixlm.chat_template import render_chat, template_stop_ids
from radixlm.entrypoints.http_utils import (
    SSE_DONE,
    aclose,
    all_outputs,
    collect,
    open_stream,
    parse_body,
    sse,
    sse_error,
    sse_response,
)
from radixlm.entrypoints.openai.errors import APIError, JSONResponse
from radixlm.entrypoints.openai.protocol import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatMessage,
    ChatResponseMessage,
)
from radixlm.entrypoints.openai.utils import (
    batch_rids,
    chat_logprobs,
    finish_fields,
    make_usage,
    new_id,
    num_output_logprobs,
)
from radixlm.entrypoints.server_state import ServerState
from radixlm.managers.request_input import GenerateReqInput


def message_dicts(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The messages as template input; raise APIError for content the model cannot take."""
    out = []
    for i, m in enumerate(messages):
        d = m.model_dump(exclude_none=True)
        if m.role == "developer":
            d["role"] = "system"
        if isinstance(m.content, list):
            if any(p.type != "text" for p in m.content):
                raise APIError("This model accepts text only; image content is not supported",
                               param=f"messages.{i}.content")
            d["content"] = "\n".join(p.text for p in m.content if p.type == "text")
        d.setdefault("content", "")
        out.append(d)
    return out


def build_chat_prompt(state: ServerState, req: ChatCompletionRequest) -> list[int]:
    """Token ids of the templated conversation; raise APIError(400) on a template error."""
    tm = state.tm
    assert state.chat_template is not None
    try:
        text = render_chat(state.chat_template, tm.tokenizer, message_dicts(req.messages),
                           add_generation_prompt=req.add_generation_prompt,
                           continue_final_message=req.continue_final_message,
                           tools=req.tools, template_kwargs=req.chat_template_kwargs)
    except ValueError as e:
        raise APIError(str(e), param="messages") from e
    return list(tm.tokenizer.encode(text, add_special_tokens=False))


async def create_chat_completion(request: Request, state: ServerState) -> Response:
    tm = state.engine()
    req = await parse_body(request, ChatCompletionRequest)
    input_ids = build_chat_prompt(state, req)
    max_new = req.max_new_tokens or max(1, state.context_length - len(input_ids))
    params = req.sampling_params(max_new)
    assert state.chat_template is not None
    stop_ids, stop_strs = template_stop_ids(state.chat_template, tm.tokenizer)
    params["stop_token_ids"] = sorted(set(params["stop_token_ids"]) | set(stop_ids))
    params["stop"] = params["stop"] + [s for s in stop_strs if s not in params["stop"]]
    obj = GenerateReqInput(
        input_ids=input_ids, sampling_params=params, rid=batch_rids(req.rid, "chatcmpl", 1)[0],
        return_logprob=req.logprobs, top_logprobs_num=req.top_logprobs or 0,
        stream=req.stream,
    )
    translator = _Translator(req, tm.tokenizer, state.model_name)
    if not req.stream:
        outs = await collect(request, tm.generate(obj))
        return JSONResponse(translator.response(outs))
    outputs = tm.generate(obj)
    first = await open_stream(request, outputs)
    return sse_response(translator.events(all_outputs(first, outputs)))


class _Translator:
    """Runtime outputs of one chat request → OpenAI responses or chunks."""

    def __init__(self, req: ChatCompletionRequest, tokenizer: Any, model_name: str) -> None:
        self.req = req
        self.tokenizer = tokenizer
        self.model = req.model or model_name
        self.id = new_id("chatcmpl")
        self.created = int(time.time())

    def response(self, outs: list[dict[str, Any]]) -> dict[str, Any]:
        choices = []
        for out in outs:
            meta = out["meta_info"]
            logprobs = None
            if self.req.logprobs:
                logprobs = ChatLogprobs(content=chat_logprobs(meta, self.tokenizer))
            finish, matched = finish_fields(meta)
            choices.append(ChatChoice(
                index=out["index"], message=ChatResponseMessage(content=out["text"]),
                logprobs=logprobs, finish_reason=finish, matched_stop=matched))
        usage = make_usage({o["index"]: o["meta_info"] for o in outs}, self.req.n)
        return ChatCompletionResponse(id=self.id, created=self.created, model=self.model,
                                      choices=choices, usage=usage).model_dump()

    def _chunk(self, choices: list[dict[str, Any]], usage: Any = None) -> bytes:
        return sse({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                    "model": self.model, "choices": choices,
                    "usage": usage.model_dump() if usage is not None else None})

    @staticmethod
    def _choice(index: int, delta: dict[str, Any], logprobs: ChatLogprobs | None = None,
                finish: str | None = None, matched: str | int | None = None) -> dict[str, Any]:
        return {"index": index, "delta": delta,
                "logprobs": logprobs.model_dump() if logprobs is not None else None,
                "finish_reason": finish, "matched_stop": matched}

    async def events(self, outputs: AsyncIterator[dict[str, Any] | APIError]
                     ) -> AsyncGenerator[bytes, None]:
        metas: dict[int, dict[str, Any]] = {}
        num_sent: dict[int, int] = {}  # output logprobs sent, per index
        try:
            async for out in outputs:
                if isinstance(out, APIError):
                    yield sse_error(out)
                    break
                index, meta = out["index"], out["meta_info"]
                if index not in metas:
                    yield self._chunk([self._choice(index, {"role": "assistant", "content": ""})])
                metas[index] = meta
                logprobs = None
                if self.req.logprobs:
                    content = chat_logprobs(meta, self.tokenizer, num_sent.get(index, 0))
                    num_sent[index] = num_output_logprobs(meta)
                    logprobs = ChatLogprobs(content=content) if content else None
                finish, matched = finish_fields(meta)
                delta = out["delta"]
                if not delta and logprobs is None and finish is None:
                    continue
                yield self._chunk([self._choice(index, {"content": delta} if delta else {},
                                                logprobs, finish, matched)])
            else:
                if self.req.include_usage:
                    yield self._chunk([], make_usage(metas, self.req.n))
            yield SSE_DONE
        finally:
            await aclose(outputs)
