"""Pydantic models of the OpenAI-compatible requests (validated) and responses.

Requests ignore fields they do not know (clients send many optional OpenAI
fields), but every field they declare is checked for type and range, so a bad
value is a 400 that names the field. Types are strict (`StrictModel`): no
string is a number or a boolean, no boolean an integer, and floats are finite.
Ranges the runtime also checks (`SamplingParams.verify`) are repeated here where
OpenAI documents them or where float32 sampling needs them (messages/sampling_params.py).
Responses are plain models whose `model_dump()` is the wire format.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    model_validator,
)

from radixlm.entrypoints.http.strict import StrictModel
from radixlm.entrypoints.openai.grammar import ResponseFormat, request_grammar
from radixlm.entrypoints.openai.peer_fields import StructuredOutputs, peer_grammars
from radixlm.messages.sampling_params import (
    MAX_LOGIT_BIAS,
    MAX_N,
    MAX_REPETITION_PENALTY,
    MAX_TEMPERATURE,
    MIN_REPETITION_PENALTY,
    SEED_MAX,
    SEED_MIN,
)

# ---------------------------------------------------------------- requests

TOO_MANY_CONSTRAINTS = (
    "Only one constraint per request: response_format (non-text), regex, ebnf, json_schema, "
    "structured_outputs, guided_json / guided_regex / guided_choice / guided_grammar or "
    "grammar")

LogitBias = Annotated[float, Field(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)]


class StreamOptions(StrictModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _SamplingRequest(StrictModel):
    """Fields shared by completions and chat: OpenAI's, then SGLang's extras."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None  # NOTE: accepted whatever it names, as SGLang does
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: float = Field(1.0, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, LogitBias] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Extras
    top_k: int = Field(-1, ge=-1)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    min_tokens: int = Field(0, ge=0)
    repetition_penalty: float = Field(1.0, ge=MIN_REPETITION_PENALTY, le=MAX_REPETITION_PENALTY)
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    rid: str | None = None
    return_hidden_states: bool = False  # SGLang's: per choice, the last hidden state
    # vLLM's and SGLang's, with --enable-priority-scheduling
    priority: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    # Constrained decoding (see grammar.py): at most one of these
    response_format: ResponseFormat | None = None
    regex: str | None = None
    ebnf: str | None = None
    json_schema: str | dict[str, Any] | None = None
    # The peers' fields (see peer_fields.py): vLLM's, then llama.cpp's GBNF `grammar`
    structured_outputs: StructuredOutputs | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    grammar: str | None = None
    _grammar: tuple[str, str] | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _check_grammar(self) -> _SamplingRequest:
        own = request_grammar(self.response_format, self.regex, self.ebnf, self.json_schema)
        guided = {name: getattr(self, name) for name in (
            "guided_json", "guided_regex", "guided_choice", "guided_grammar",
            "guided_whitespace_pattern")}
        found = ([own] if own else []) + peer_grammars(self.structured_outputs, guided,
                                                       self.grammar)
        if len(found) > 1:
            raise ValueError(TOO_MANY_CONSTRAINTS)
        self._grammar = found[0] if found else None
        return self

    @property
    def has_grammar(self) -> bool:
        return self._grammar is not None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """vLLM's `stream_options.continuous_usage_stats` (with include_usage): every
        chunk carries the usage so far."""
        return bool(self.include_usage and self.stream_options
                    and self.stream_options.continuous_usage_stats)

    def sampling_params(self, max_new_tokens: int | None) -> dict[str, Any]:
        """The runtime's sampling_params dict for this request (max_new_tokens None: up
        to the end of the context)."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        params: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "min_new_tokens": min(self.min_tokens, max_new_tokens or self.min_tokens),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "repetition_penalty": self.repetition_penalty,
            "logit_bias": dict(self.logit_bias) if self.logit_bias else None,
            "stop": stop,
            "stop_token_ids": list(self.stop_token_ids or []),
            "stop_regex": self.stop_regex or [],
            "ignore_eos": self.ignore_eos,
            "seed": self.seed,
            "n": self.n,
            "skip_special_tokens": self.skip_special_tokens,
            "spaces_between_special_tokens": self.spaces_between_special_tokens,
            "no_stop_trim": self.no_stop_trim,
        }
        if self._grammar is not None:
            kind, text = self._grammar
            params[kind] = text
        return params


def _prompt_kind(value: Any) -> str:
    """Which Prompt member a value is, from its first element: a plain union would validate
    a 2M-token list against every member (seconds, on the event loop)."""
    if isinstance(value, str) or not isinstance(value, list) or not value:
        return "text" if isinstance(value, str) else "texts"
    first = value[0]
    return "texts" if isinstance(first, str) else "batch" if isinstance(first, list) else "ids"


Prompt = Annotated[
    Annotated[str, Tag("text")] | Annotated[list[str], Tag("texts")]
    | Annotated[list[int], Tag("ids")] | Annotated[list[list[int]], Tag("batch")],
    Discriminator(_prompt_kind),
]


class CompletionRequest(_SamplingRequest):
    prompt: Prompt
    max_tokens: int = Field(16, ge=0)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _check(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt must not be an empty list")
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of must equal n (or be left out)")
        return self


class ImageURL(StrictModel):
    url: str  # http(s) URL, data URL, base64, or a path under --allowed-local-media-path
    # NOTE: accepted for compatibility; the model's processor decides the resolution.
    detail: Literal["auto", "low", "high"] | None = None


class TextPart(StrictModel):
    type: Literal["text"]
    text: str


class ImagePart(StrictModel):
    type: Literal["image_url"]
    image_url: ImageURL
    # SGLang's hint: "video" makes the URL a video file (as a video_url part would).
    modalities: Literal["image", "multi-images", "video"] | None = None


class VideoURL(StrictModel):
    url: str | list[str] = Field(min_length=1)  # a video file, or its frames (image sources)


class VideoPart(StrictModel):
    type: Literal["video_url"]
    video_url: VideoURL


ContentPart = Annotated[TextPart | ImagePart | VideoPart, Field(discriminator="type")]


class ChatMessage(StrictModel):
    model_config = ConfigDict(extra="allow")  # template-specific keys pass through

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _check(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content")
        return self


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    # Extras: constrain tool_choice "auto" (None: the server's --tool-call-constrained);
    # split the think block into reasoning_content (with --reasoning-parser).
    tool_call_constrained: bool | None = None
    separate_reasoning: bool = True
    # vLLM's: the most tokens inside the think block (with --reasoning-parser); None: the
    # server's --reasoning-budget.
    thinking_token_budget: int | None = Field(None, ge=0)
    # Extras
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    # OpenAI's output modalities (only text here) and SGLang's input hints.
    modalities: list[Literal["text", "image", "multi-images", "video"]] | None = None

    @model_validator(mode="after")
    def _check(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        if self.continue_final_message:
            if self.messages[-1].role != "assistant":
                raise ValueError("continue_final_message needs a final assistant message")
            self.add_generation_prompt = False
        reserved = {"conversation", "messages", "tokenize", "chat_template", "tools"}
        clash = sorted(reserved.intersection(self.chat_template_kwargs or {}))
        if clash:
            raise ValueError(f"chat_template_kwargs may not set {', '.join(clash)}")
        return self

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class TokenizeRequest(StrictModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | list[str]
    add_special_tokens: bool = True


class DetokenizeRequest(StrictModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    tokens: list[int] | list[list[int]]
    skip_special_tokens: bool = False


# ---------------------------------------------------------------- responses


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class CompletionTokensDetails(BaseModel):
    # NOTE: radixlm's extra inside OpenAI's object: completion tokens that jump-forward
    # appended without sampling (they also count in completion_tokens).
    jump_forward_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)
    completion_tokens_details: CompletionTokensDetails = Field(
        default_factory=CompletionTokensDetails)


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    matched_stop: str | int | None = None


class CompletionResponse(BaseModel):
    id: str
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float | None
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class ChatResponseMessage(BaseModel):
    role: str = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    matched_stop: str | int | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: str = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class DeltaMessage(BaseModel):
    role: str | None = None
    content: str | None = None


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    matched_stop: str | int | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: str = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatStreamChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "radixlm"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelCard] = Field(default_factory=list)
