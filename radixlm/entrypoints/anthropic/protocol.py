"""Pydantic models of Anthropic's Messages API requests (validated strictly).

Requests ignore fields they do not know (Anthropic's clients send beta fields
such as `cache_control` and `container`), but every field they declare is
checked for type and range, as Anthropic checks them: `temperature` and `top_p`
in [0, 1], `top_k` >= 1, `max_tokens` >= 1, roles `user` / `assistant`, and
content blocks by their `type`. A block type this server cannot act on
(documents, server tools' results) is a 400 that names it, never dropped.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from radixlm.entrypoints.http.strict import StrictModel


class _Lenient(StrictModel):
    model_config = ConfigDict(extra="ignore")


class TextBlock(_Lenient):
    type: Literal["text"]
    text: str


class ImageSource(_Lenient):
    type: Literal["base64", "url"]
    media_type: str | None = None
    data: str | None = None
    url: str | None = None

    @model_validator(mode="after")
    def _check(self) -> ImageSource:
        if self.type == "base64" and (not self.data or not self.media_type):
            raise ValueError('an image source of type "base64" needs "media_type" and "data"')
        if self.type == "url" and not self.url:
            raise ValueError('an image source of type "url" needs "url"')
        return self

    @property
    def as_url(self) -> str:
        """What the media loader takes: a data URL or the URL itself."""
        if self.type == "url":
            assert self.url is not None
            return self.url
        return f"data:{self.media_type};base64,{self.data}"


class ImageBlock(_Lenient):
    type: Literal["image"]
    source: ImageSource


class ToolUseBlock(_Lenient):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]


ToolResultPart = Annotated[TextBlock | ImageBlock, Field(discriminator="type")]


class ToolResultBlock(_Lenient):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[ToolResultPart] | None = None
    is_error: bool | None = None


class ThinkingBlock(_Lenient):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Lenient):
    type: Literal["redacted_thinking"]
    data: str


ContentBlock = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock
    | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class Message(_Lenient):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class Tool(_Lenient):
    """A client tool. Anthropic's server tools (`web_search_...`, `bash_...`) carry
    another `type` and are refused: nothing here runs them."""

    type: Literal["custom"] | None = None
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any]


class ToolChoice(_Lenient):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False

    @model_validator(mode="after")
    def _check(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError('tool_choice of type "tool" needs the tool\'s "name"')
        return self


class Thinking(_Lenient):
    """`{"type": "enabled", "budget_tokens": N}` | `{"type": "disabled"}` |
    `{"type": "adaptive"}` (the model decides, no budget)."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=0)
    display: Literal["summarized", "omitted"] | None = None  # omitted: empty thinking blocks

    @model_validator(mode="after")
    def _check(self) -> Thinking:
        if self.type == "enabled" and self.budget_tokens is None:
            raise ValueError('thinking of type "enabled" needs "budget_tokens"')
        return self


class OutputFormat(_Lenient):
    """Structured outputs: `{"type": "json_schema", "schema": {...}}`."""

    model_config = ConfigDict(populate_by_name=True)

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Lenient):
    format: OutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None


class Metadata(_Lenient):
    user_id: str | None = None


class ConversationRequest(_Lenient):
    """What /v1/messages and /v1/messages/count_tokens share."""

    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    # The structured-output fields: the beta's `output_format` and the newer
    # `output_config.format` (one of them).
    output_format: OutputFormat | None = None
    output_config: OutputConfig | None = None

    @model_validator(mode="after")
    def _check_format(self) -> ConversationRequest:
        if self.output_format is not None and self.output_config is not None \
                and self.output_config.format is not None:
            raise ValueError("give output_format or output_config.format, not both")
        return self

    @property
    def json_schema(self) -> dict[str, Any] | None:
        if self.output_format is not None:
            return self.output_format.schema_
        if self.output_config is not None and self.output_config.format is not None:
            return self.output_config.format.schema_
        return None


class MessagesRequest(ConversationRequest):
    """POST /v1/messages."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=1)
    metadata: Metadata | None = None
    service_tier: str | None = None  # accepted: this server has one tier

    @property
    def shows_thinking(self) -> bool:
        return self.thinking is None or self.thinking.display != "omitted"


class CountTokensRequest(ConversationRequest):
    """POST /v1/messages/count_tokens."""
