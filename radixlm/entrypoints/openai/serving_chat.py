"""POST /v1/chat/completions: messages → chat template → native generate → choices.

- Messages → prompt ids plus their images and videos: see chat_prompt.py;
  the media travel to the runtime as `image_data` / `video_data`. Without
  max_tokens a reply may run to the end of the context.
- Streaming: each choice's first chunk carries `role`, later chunks the new
  content, and its last chunk the one `finish_reason` (and `matched_stop`);
  `stream_options.include_usage` adds a final chunk with `usage` and no choices;
  with `continuous_usage_stats` too, every chunk carries the usage so far (vLLM's).
- Tools and reasoning (see tools.py): each choice's text goes through the
  reasoning parser, then the tool parser; `reasoning_content`, `content` and
  `tool_calls` (OpenAI's delta shape when streaming: one entry per call, sent
  once the call is complete), finish_reason "tool_calls" when the choice
  called. A grammar starts after the think block; `thinking_token_budget`
  (vLLM's) bounds the block. An answer cut by max_tokens keeps its complete
  calls (finish_reason "length"); one that repeats a call or reaches the call
  limit ends there (call_watch.py).
- SGLang's stream shape: every delta carries `reasoning_content` (null when
  there is none), and with return_hidden_states each choice's last hidden
  state comes in `delta.hidden_states` of a chunk after its finish chunk.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from starlette.requests import Request
from starlette.responses import Response

from radixlm.chat_template import template_stop_ids
from radixlm.entrypoints.http.errors import APIError, JSONResponse
from radixlm.entrypoints.http.state import ServerState
from radixlm.entrypoints.http.utils import collect, parse_body, sse, sse_stream
from radixlm.entrypoints.openai.call_watch import STOP_MESSAGE, collect_watching
from radixlm.entrypoints.openai.chat_prompt import build_chat_prompt
from radixlm.entrypoints.openai.protocol import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatResponseMessage,
)
from radixlm.entrypoints.openai.tools import ChoiceParser, ToolPlan, finish_reason, plan_tools
from radixlm.entrypoints.openai.utils import (
    LastHiddenStates,
    batch_rids,
    chat_logprobs,
    finish_fields,
    make_usage,
    new_id,
)
from radixlm.messages.generate_output import GenerateOutput
from radixlm.reasoning import ReasoningParser
from radixlm.reasoning.gate import grammar_phase, reasoning_for_prompt
from radixlm.tokenizer.request_input import GenerateReqInput


class ChatJob(NamedTuple):
    """A chat request ready for the runtime, and how to read its outputs."""

    obj: GenerateReqInput
    tools: ToolPlan | None
    reasoner: ReasoningParser | None

    def parser(self) -> ChoiceParser:
        return ChoiceParser(self.tools, self.reasoner)

    @property
    def watched(self) -> bool:
        """Whether the answers must be watched for a repeated call or the call limit."""
        return self.tools is not None and self.tools.active


async def prepare_chat(state: ServerState, req: ChatCompletionRequest) -> ChatJob:
    """Validate the tools, render the prompt and build the runtime request (also used
    by /v1/responses); APIError(400) on bad input."""
    tm = state.tokenizer_engine("A chat request")
    assert state.agents is not None
    tools = plan_tools(state.agents, state.args.grammar_backend, req.tools, req.tool_choice,
                       req.parallel_tool_calls, req.tool_call_constrained, req.has_grammar)
    prompt = await tm.tokenizer_workers.run(build_chat_prompt, state, req, tools)
    # None: to the end of the context, known in the runtime once images are expanded.
    params = req.sampling_params(req.max_new_tokens)
    assert state.chat_template is not None
    stop_ids, stop_strs = template_stop_ids(state.chat_template, tm.tokenizer)
    params["stop_token_ids"] = sorted(set(params["stop_token_ids"]) | set(stop_ids))
    params["stop"] = params["stop"] + [s for s in stop_strs if s not in params["stop"]]
    if tools is not None and tools.active:
        if tools.constraint is not None:
            params[tools.constraint[0]] = tools.constraint[1]
        if state.agents.keep_special_tokens:
            params["skip_special_tokens"] = False
    reasoner = None
    if state.agents.reasoning_parser is not None:
        thinking = (req.chat_template_kwargs or {}).get("enable_thinking", True) is not False
        reasoner = reasoning_for_prompt(state.agents.reasoning_parser, prompt.text, thinking)
        params["reasoning_phase"] = grammar_phase(reasoner, prompt.text)
    if req.thinking_token_budget is not None:
        if reasoner is None:
            raise APIError("thinking_token_budget needs a server started with "
                           "--reasoning-parser (it knows where the think block ends)",
                           param="thinking_token_budget")
        params["thinking_token_budget"] = req.thinking_token_budget
    obj = GenerateReqInput(
        input_ids=prompt.input_ids, sampling_params=params,
        rid=batch_rids(req.rid, "chatcmpl", 1)[0], return_logprob=req.logprobs,
        top_logprobs_num=req.top_logprobs or 0, stream=req.stream,
        image_data=prompt.image_data or None, video_data=prompt.video_data or None,
        return_hidden_states=req.return_hidden_states,
        priority=req.priority,
    )
    return ChatJob(obj, tools, reasoner if req.separate_reasoning else None)


async def create_chat_completion(request: Request, state: ServerState) -> Response:
    tm = state.engine()
    req = await parse_body(request, ChatCompletionRequest)
    job = await prepare_chat(state, req)
    translator = _Translator(req, tm, state.model_name, job)
    if not req.stream:
        return JSONResponse(translator.response(await run_chat(request, tm, job)))
    return await sse_stream(request, tm.generate(job.obj), translator.events, translator.tail)


async def run_chat(request: Request, tm: Any, job: ChatJob) -> list[GenerateOutput]:
    """A non-streaming chat job's final outputs (one per choice); with tools, each answer
    is watched and ended at a repeated call or the call limit."""
    if job.watched:
        return await collect_watching(request, tm, job.obj, job.parser)
    return await collect(request, tm.generate(job.obj))


def is_cut(finish: str | None) -> bool:
    """An output that ended early: max_tokens, or the route (or the client) stopped it."""
    return finish in ("length", "abort")


class _Translator:
    """Runtime outputs of one chat request → OpenAI responses or chunks."""

    def __init__(self, req: ChatCompletionRequest, tm: Any, model_name: str,
                 job: ChatJob) -> None:
        self.req = req
        self.tm = tm
        self.tokenizer = tm.tokenizer
        self.job = job
        self.model = req.model or model_name
        self.id = new_id("chatcmpl")
        self.created = int(time.time())
        self.latest: dict[int, GenerateOutput] = {}  # each choice's latest output (usage)
        self.parsers: dict[int, ChoiceParser] = {}  # per choice, when streaming
        self.ended: set[int] = set()  # choices whose finish chunk was sent
        self.hidden = LastHiddenStates()

    def response(self, outs: list[GenerateOutput]) -> dict[str, Any]:
        choices = []
        for out in outs:
            logprobs = None
            if self.req.logprobs:
                logprobs = ChatLogprobs(content=chat_logprobs(out, self.tokenizer))
            finish, matched = finish_fields(out)
            parser = self.job.parser()
            parsed = parser.parse_whole(out.text, cut=is_cut(finish))
            message = ChatResponseMessage(
                content=parsed.content if parsed.content or not parsed.tool_calls else None,
                reasoning_content=parsed.reasoning or None,
                tool_calls=parsed.tool_calls or None)
            choices.append(ChatChoice(
                index=out.index, message=message, logprobs=logprobs,
                finish_reason=finish_reason(finish, parser),
                matched_stop=None if parser.stopped else matched))
            self.hidden.add(out)
        usage = make_usage({o.index: o for o in outs}, self.req.n)
        body = ChatCompletionResponse(id=self.id, created=self.created, model=self.model,
                                      choices=choices, usage=usage).model_dump()
        if self.req.return_hidden_states:
            for choice, out in zip(body["choices"], outs):
                choice["hidden_states"] = self.hidden.of(out)
        return body

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
        events: list[bytes] = []
        first_seen = out.index not in self.latest
        self.latest[out.index] = out
        self.hidden.add(out)
        if out.index in self.ended:  # stopped at a call: what follows is not shown
            return events
        usage = make_usage(self.latest, self.req.n) if self.req.continuous_usage else None
        if first_seen:
            events.append(self._chunk([self._choice(out.index, _delta(
                role="assistant", content=""))], usage))
        logprobs = None
        if self.req.logprobs:
            token_logprobs = chat_logprobs(out, self.tokenizer)
            logprobs = ChatLogprobs(content=token_logprobs) if token_logprobs else None
        finish, matched = finish_fields(out)
        parser = self.parsers.setdefault(out.index, self.job.parser())
        reasoning, content, calls = parser.feed(out.text, final=finish is not None,
                                                cut=is_cut(finish))
        if parser.stopped and finish is None:  # a repeated call or the call limit
            self.tm.abort_request(out.rid, message=STOP_MESSAGE)
            finish, matched = "stop", None
        delta = _delta(reasoning=reasoning, content=content, calls=calls)
        if reasoning or content or calls or logprobs is not None or finish is not None:
            if finish is not None:
                self.ended.add(out.index)
                matched = None if parser.stopped else matched
            events.append(self._chunk([self._choice(
                out.index, delta, logprobs, finish_reason(finish, parser), matched)], usage))
        return events

    def tail(self) -> list[bytes]:
        """After the last output: each choice's hidden states (as SGLang: in the delta of
        a chunk of their own, after the finish chunks) and the usage chunk, when asked."""
        events = []
        if self.req.return_hidden_states:
            events = [self._chunk([self._choice(i, _delta(hidden_states=self.hidden.of(o)))])
                      for i, o in sorted(self.latest.items())]
        if self.req.include_usage:
            events.append(self._chunk([], make_usage(self.latest, self.req.n)))
        return events


def _delta(role: str | None = None, content: str | None = None, reasoning: str = "",
           calls: list[dict[str, Any]] | None = None,
           hidden_states: list[float] | None = None) -> dict[str, Any]:
    """A chunk's delta: `reasoning_content` always (null when none, as SGLang sends it:
    clients read the attribute), the rest when present."""
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if content or content == "" and role is not None:
        delta["content"] = content
    delta["reasoning_content"] = reasoning or None
    if calls:
        delta["tool_calls"] = calls
    if hidden_states is not None:
        delta["hidden_states"] = hidden_states
    return delta
