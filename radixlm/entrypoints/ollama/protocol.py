"""Pydantic models of Ollama's API requests (validated strictly).

Unknown fields are ignored (Ollama's clients send fields of newer versions),
but every declared field is checked for type and range. `options` holds the
Modelfile parameters: the sampling ones are used (see translate.py), the ones
about loading a model (GPU layers, threads, mmap, ...) do not apply to a
running server and are accepted as no-ops, and the samplers this server does
not have (mirostat, typical_p, tfs_z) are a 400 unless they are left at the
value that turns them off.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from radixlm.entrypoints.http.strict import StrictModel
from radixlm.messages.sampling_params import (
    MAX_REPETITION_PENALTY,
    MAX_TEMPERATURE,
    MIN_REPETITION_PENALTY,
    SEED_MAX,
    SEED_MIN,
)

Think = bool | Literal["low", "medium", "high"]
KeepAlive = str | int | float | None


class _Lenient(StrictModel):
    model_config = ConfigDict(extra="ignore")


class Options(_Lenient):
    """Modelfile parameters (Ollama's `Options`)."""

    # Sampling
    temperature: float | None = Field(None, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = None  # <= 0: off
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    num_predict: int | None = Field(None, ge=-2)  # -1: no limit, -2: to the end of num_ctx
    stop: list[str] | None = None
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)  # -1: random (Ollama's default)
    repeat_penalty: float | None = Field(None, ge=MIN_REPETITION_PENALTY,
                                         le=MAX_REPETITION_PENALTY)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repeat_last_n: int | None = Field(None, ge=-1)  # the penalties cover the whole output
    num_ctx: int | None = Field(None, ge=1)
    # Samplers this server lacks: only their "off" values
    typical_p: float | None = None
    tfs_z: float | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    penalize_newline: bool | None = None  # dropped by Ollama itself
    # Loading a model: no-ops on a running server
    num_keep: int | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    num_thread: int | None = None
    numa: bool | None = None
    low_vram: bool | None = None
    vocab_only: bool | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    logits_all: bool | None = None
    embedding_only: bool | None = None

    @model_validator(mode="after")
    def _check(self) -> Options:
        if self.typical_p not in (None, 1.0):
            raise ValueError("typical_p is not supported (only 1.0, its off value)")
        if self.tfs_z not in (None, 1.0):
            raise ValueError("tfs_z is not supported (only 1.0, its off value)")
        if self.mirostat not in (None, 0):
            raise ValueError("mirostat is not supported (only 0, its off value)")
        if self.num_predict == 0:
            raise ValueError("num_predict must be at least 1 (or -1 for no limit)")
        return self


class ToolCallFunction(_Lenient):
    index: int | None = None
    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCall(_Lenient):
    id: str | None = None
    function: ToolCallFunction


class Message(_Lenient):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[str] | None = None  # base64 (or URLs / data URLs)
    thinking: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None  # a tool result's function
    tool_call_id: str | None = None


class _Generation(_Lenient):
    model: str = Field(min_length=1)
    stream: bool = True
    format: Literal["", "json"] | dict[str, Any] | None = None
    options: Options | None = None
    keep_alive: KeepAlive = None
    think: Think | None = None


class ChatRequest(_Generation):
    """POST /api/chat (empty `messages`: load the model, answer at once)."""

    messages: list[Message] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None


class GenerateRequest(_Generation):
    """POST /api/generate (empty `prompt`: load the model, answer at once)."""

    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[str] | None = None

    @model_validator(mode="after")
    def _check(self) -> GenerateRequest:
        if self.suffix:
            raise ValueError("suffix (fill-in-the-middle) is not supported")
        if self.template:
            raise ValueError("template is not supported: the server renders prompts with "
                             "its chat template (--chat-template)")
        return self


class ShowRequest(_Lenient):
    """POST /api/show: `model` (or the older `name`)."""

    model: str | None = None
    name: str | None = None
    verbose: bool = False

    @model_validator(mode="after")
    def _check(self) -> ShowRequest:
        if not (self.model or self.name):
            raise ValueError("model is required")
        return self


class EmbedRequest(_Lenient):
    """POST /api/embed."""

    model: str = Field(min_length=1)
    input: str | list[str]
    truncate: bool = True
    dimensions: int | None = Field(None, ge=1)
    options: Options | None = None
    keep_alive: KeepAlive = None


class EmbeddingsRequest(_Lenient):
    """POST /api/embeddings (the older, single-prompt form)."""

    model: str = Field(min_length=1)
    prompt: str
    options: Options | None = None
    keep_alive: KeepAlive = None
