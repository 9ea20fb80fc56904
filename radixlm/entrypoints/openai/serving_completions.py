"""POST /v1/completions: translate to a native generate request and back.

- Prompts (a string, strings, token ids, lists of token ids) are tokenized
  here, so echo and prompt logprobs line up with the exact prompt tokens.
- A batch of P prompts with `n` samples each gives P * n choices; choice
  `i * n + j` is sample j of prompt i (the runtime's output index).
- `echo` puts the prompt before each choice's text; with `logprobs` it asks
  the runtime for prompt logprobs from position 0 (the first prompt token has
  logprob None: nothing precedes it).
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from radixlm.entrypoints.http.errors import APIError, JSONResponse
from radixlm.entrypoints.http.state import ServerState
from radixlm.entrypoints.http.utils import collect, parse_body, sse, sse_stream
from radixlm.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
)
from radixlm.entrypoints.openai.utils import (
    CompletionLogprobsBuilder,
    LastHiddenStates,
    batch_rids,
    finish_fields,
    make_usage,
    merge_logprobs,
    new_id,
)
from radixlm.messages.generate_output import GenerateOutput
from radixlm.tokenizer.async_tokenizer import AsyncTokenizer
from radixlm.tokenizer.request_input import GenerateReqInput
from radixlm.tokenizer.validation import prompt_too_long


def tokenize_prompts(prompt: Any, workers: AsyncTokenizer, context_len: int
                     ) -> list[tuple[str, list[int]]]:
    """(text, token ids) per prompt; the text of a token-id prompt is its decoding.

    Blocking: run it in a tokenizer worker. A text its size proves longer than
    the context is refused (ValueError) before it is tokenized.
    """
    tokenizer = workers.tokenizer
    texts = [prompt] if isinstance(prompt, str) else prompt
    if all(isinstance(p, str) for p in texts):
        for text in texts:
            workers.check_fits(text, context_len)
        return [(p, list(tokenizer.encode(p))) for p in texts]
    if all(isinstance(p, int) for p in prompt):
        prompt = [prompt]
    for ids in prompt:
        if len(ids) >= context_len:  # before decoding it
            raise ValueError(prompt_too_long(len(ids), context_len))
    return [(_safe_decode(tokenizer, ids), list(ids)) for ids in prompt]


def _safe_decode(tokenizer: Any, ids: list[int]) -> str:
    try:
        return str(tokenizer.decode(ids))
    except Exception:  # noqa: BLE001 - ids outside the vocabulary; validation says so later
        return ""


async def create_completion(request: Request, state: ServerState) -> Response:
    tm = state.tokenizer_engine("/v1/completions")
    req = await parse_body(request, CompletionRequest)
    workers = tm.tokenizer_workers
    try:
        prompts = await workers.run(tokenize_prompts, req.prompt, workers,
                                    state.context_length or 1 << 30)
    except ValueError as e:
        raise APIError(str(e), param="prompt") from e
    want_logprobs = req.logprobs is not None
    obj = GenerateReqInput(
        input_ids=[ids for _, ids in prompts],
        sampling_params=req.sampling_params(req.max_tokens),
        rid=batch_rids(req.rid, "cmpl", len(prompts)),
        return_logprob=want_logprobs,
        logprob_start_len=0 if req.echo and want_logprobs else None,
        top_logprobs_num=req.logprobs or 0,
        stream=req.stream,
        return_hidden_states=req.return_hidden_states,
    )
    translator = _Translator(req, prompts, tm.tokenizer, state.model_name)
    if not req.stream:
        outs = await collect(request, tm.generate(obj))
        return JSONResponse(translator.response(outs))
    return await sse_stream(request, tm.generate(obj), translator.events, translator.tail)


class _Translator:
    """Runtime outputs of one completions request → OpenAI responses or chunks."""

    def __init__(self, req: CompletionRequest, prompts: list[tuple[str, list[int]]],
                 tokenizer: Any, model_name: str) -> None:
        self.req = req
        self.prompts = prompts
        self.tokenizer = tokenizer
        self.model = req.model or model_name
        self.id = new_id("cmpl")
        self.created = int(time.time())
        self.want_logprobs = req.logprobs is not None
        self.latest: dict[int, GenerateOutput] = {}  # each choice's latest output (usage)
        self.builders: dict[int, CompletionLogprobsBuilder] = {}  # per choice, for offsets
        self.hidden = LastHiddenStates()

    def _prompt_of(self, index: int) -> tuple[str, list[int]]:
        return self.prompts[index // self.req.n]

    def response(self, outs: list[GenerateOutput]) -> dict[str, Any]:
        choices = []
        for out in outs:
            prompt_text, prompt_ids = self._prompt_of(out.index)
            logprobs = None
            if self.want_logprobs:
                builder = CompletionLogprobsBuilder(self.tokenizer)
                head = builder.prompt(prompt_ids, out) if self.req.echo else CompletionLogprobs()
                logprobs = merge_logprobs(head, builder.output(out))
            finish, matched = finish_fields(out)
            text = prompt_text + out.text if self.req.echo else out.text
            choices.append(CompletionChoice(index=out.index, text=text, logprobs=logprobs,
                                            finish_reason=finish, matched_stop=matched))
            self.hidden.add(out)
        usage = make_usage({o.index: o for o in outs}, self.req.n)
        body = CompletionResponse(id=self.id, created=self.created, model=self.model,
                                  choices=choices, usage=usage).model_dump()
        if self.req.return_hidden_states:
            for choice, out in zip(body["choices"], outs):
                choice["hidden_states"] = self.hidden.of(out)
        return body

    def _chunk(self, choices: list[dict[str, Any]], usage: Any = None) -> bytes:
        return sse({"id": self.id, "object": "text_completion", "created": self.created,
                    "model": self.model, "choices": choices,
                    "usage": usage.model_dump() if usage is not None else None})

    def events(self, out: GenerateOutput) -> list[bytes]:
        """The chunk for one output: its new text (after the prompt, for echo, in a
        choice's first chunk) and logprobs; none when it carries nothing."""
        index = out.index
        first_seen = index not in self.latest
        self.latest[index] = out
        self.hidden.add(out)
        text = out.text
        prompt_text, prompt_ids = self._prompt_of(index)
        if first_seen and self.req.echo:
            text = prompt_text + text
        logprobs = None
        if self.want_logprobs:
            builder = self.builders.setdefault(index, CompletionLogprobsBuilder(self.tokenizer))
            head = (builder.prompt(prompt_ids, out) if first_seen and self.req.echo
                    else CompletionLogprobs())
            logprobs = merge_logprobs(head, builder.output(out))
        finish, matched = finish_fields(out)
        if not text and not (logprobs and logprobs.tokens) and finish is None:
            return []
        usage = make_usage(self.latest, self.req.n) if self.req.continuous_usage else None
        return [self._chunk([CompletionChoice(
            index=index, text=text, logprobs=logprobs, finish_reason=finish,
            matched_stop=matched).model_dump()], usage)]

    def tail(self) -> list[bytes]:
        """After the last output: each choice's hidden states (SGLang sends them in a
        chunk of their own) and the usage chunk, when asked for."""
        events = []
        if self.req.return_hidden_states:
            events = [self._chunk([{"index": i, "text": "", "logprobs": None,
                                    "finish_reason": None, "hidden_states": self.hidden.of(o)}])
                      for i, o in sorted(self.latest.items())]
        if self.req.include_usage:
            events.append(self._chunk([], make_usage(self.latest, self.req.n)))
        return events
