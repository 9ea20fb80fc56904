"""POST /v1/chat/completions: messages → chat template → native generate → choices.

- Messages → prompt ids plus their images and videos: see chat_prompt.py;
  the media travel to the runtime as `image_data` / `video_data`. Without
  max_tokens a reply may run to the end of the context.
- Streaming: each choice's first chunk carries `role`, later chunks the new
  content, and its last chunk the one `finish_reason` (and `matched_stop`);
  `stream_options.include_usage` adds a final chunk with `usage` and no choices;
  with `continuous_usage_stats` too, every chunk carries the usage so far (vLLM's).
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from radixlm.chat_template import template_stop_ids
from radixlm.entrypoints.http_utils import collect, parse_body, sse, sse_stream
from radixlm.entrypoints.openai.chat_prompt import build_chat_prompt
from radixlm.entrypoints.openai.errors import JSONResponse
from radixlm.entrypoints.openai.protocol import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatResponseMessage,
)
from radixlm.entrypoints.openai.utils import (
    batch_rids,
    chat_logprobs,
    finish_fields,
    make_usage,
    new_id,
)
from radixlm.entrypoints.server_state import ServerState
from radixlm.tokenizer.generate_output import GenerateOutput
from radixlm.tokenizer.request_input import GenerateReqInput


async def create_chat_completion(request: Request, state: ServerState) -> Response:
    tm = state.engine()
    req = await parse_body(request, ChatCompletionRequest)
    prompt = await tm.tokenizer_workers.run(build_chat_prompt, state, req)
    # None: to the end of the context, known in the runtime once images are expanded.
    params = req.sampling_params(req.max_new_tokens)
    assert state.chat_template is not None
    stop_ids, stop_strs = template_stop_ids(state.chat_template, tm.tokenizer)
    params["stop_token_ids"] = sorted(set(params["stop_token_ids"]) | set(stop_ids))
    params["stop"] = params["stop"] + [s for s in stop_strs if s not in params["stop"]]
    obj = GenerateReqInput(
        input_ids=prompt.input_ids, sampling_params=params,
        rid=batch_rids(req.rid, "chatcmpl", 1)[0], return_logprob=req.logprobs,
        top_logprobs_num=req.top_logprobs or 0, stream=req.stream,
        image_data=prompt.image_data or None, video_data=prompt.video_data or None,
    )
    translator = _Translator(req, tm.tokenizer, state.model_name)
    if not req.stream:
        outs = await collect(request, tm.generate(obj))
        return JSONResponse(translator.response(outs))
    return await sse_stream(request, tm.generate(obj), translator.events, translator.tail)


class _Translator:
    """Runtime outputs of one chat request → OpenAI responses or chunks."""

    def __init__(self, req: ChatCompletionRequest, tokenizer: Any, model_name: str) -> None:
        self.req = req
        self.tokenizer = tokenizer
        self.model = req.model or model_name
        self.id = new_id("chatcmpl")
        self.created = int(time.time())
        self.latest: dict[int, GenerateOutput] = {}  # each choice's latest output (usage)

    def response(self, outs: list[GenerateOutput]) -> dict[str, Any]:
        choices = []
        for out in outs:
            logprobs = None
            if self.req.logprobs:
                logprobs = ChatLogprobs(content=chat_logprobs(out, self.tokenizer))
            finish, matched = finish_fields(out)
            choices.append(ChatChoice(
                index=out.index, message=ChatResponseMessage(content=out.text),
                logprobs=logprobs, finish_reason=finish, matched_stop=matched))
        usage = make_usage({o.index: o for o in outs}, self.req.n)
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

    def events(self, out: GenerateOutput) -> list[bytes]:
        """The chunks for one output: a choice's first carries the role, then its new
        content and logprobs; the last one its finish_reason."""
        events = []
        first_seen = out.index not in self.latest
        self.latest[out.index] = out
        usage = make_usage(self.latest, self.req.n) if self.req.continuous_usage else None
        if first_seen:
            events.append(self._chunk([self._choice(out.index,
                                                    {"role": "assistant", "content": ""})],
                                      usage))
        logprobs = None
        if self.req.logprobs:
            content = chat_logprobs(out, self.tokenizer)
            logprobs = ChatLogprobs(content=content) if content else None
        finish, matched = finish_fields(out)
        if out.text or logprobs is not None or finish is not None:
            events.append(self._chunk([self._choice(
                out.index, {"content": out.text} if out.text else {}, logprobs, finish,
                matched)], usage))
        return events

    def tail(self) -> list[bytes]:
        """After the last output: the usage chunk, when asked for."""
        if not self.req.include_usage:
            return []
        return [self._chunk([], make_usage(self.latest, self.req.n))]
