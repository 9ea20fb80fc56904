"""The values tool-call parsing deals in: tools, the tool choice, calls and stream deltas.

`ToolSpec.from_openai` and `ToolChoice.from_openai` validate the OpenAI request
fields (`tools`, `tool_choice`) and raise `ToolError` with a message fit for an
HTTP 400. Everything else here is plain data.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

# OpenAI's rule for function names: a-z, A-Z, 0-9, underscores and dashes, at most 64.
TOOL_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Dots are allowed too: models and frameworks use names such as "browser.search".
_LENIENT_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class ToolError(ValueError):
    """A `tools` / `tool_choice` value that cannot be used; the message names the problem (400)
    in SGLang's words where SGLang has them (its clients' tests match them); `param` is the
    request field at fault."""

    def __init__(self, message: str, param: str = "tools") -> None:
        super().__init__(message)
        self.param = param


class ToolConstraintError(ValueError):
    """A tool-call constraint the chosen grammar backend cannot express (HTTP 400)."""


@dataclass(frozen=True)
class ToolSpec:
    """One function tool: its name, JSON-schema parameters and description."""

    name: str
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    description: str | None = None

    @property
    def object_schema(self) -> dict[str, Any]:
        """The parameters schema, saying `"type": "object"` (a schema without a type would
        let a grammar write arguments that are not an object)."""
        return {"type": "object", **self.parameters}

    @classmethod
    def from_openai(cls, tool: object, position: int = 0) -> ToolSpec:
        """Validate one entry of a request's `tools` (`{"type": "function", "function": {...}}`)."""
        where = f"tools[{position}]"
        if not isinstance(tool, Mapping):
            raise ToolError(f"{where} must be an object")
        if tool.get("type", "function") != "function":
            raise ToolError(f"{where}.type must be 'function', got {tool.get('type')!r}")
        function = tool.get("function")
        if not isinstance(function, Mapping):
            raise ToolError(f"{where}.function must be an object")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ToolError(f"{where}.function.name is required")
        if not _LENIENT_NAME_RE.fullmatch(name):
            raise ToolError(
                f"{where}.function.name {name!r} must be 1-64 characters of a-z, A-Z, 0-9, "
                "'_', '-' or '.'"
            )
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise ToolError(f"{where}.function.description must be a string")
        parameters = function.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        check_parameters_schema(parameters, position)
        return cls(name=name, parameters=parameters, description=description)


def check_parameters_schema(schema: object, position: int) -> None:
    """Raise ToolError unless `schema` is a valid JSON schema describing an object (in
    SGLang's words: "Tool 0 function has invalid 'parameters' schema: ...")."""
    problem = f"Tool {position} function has invalid 'parameters' schema"
    if not isinstance(schema, Mapping):
        raise ToolError(f"{problem}: tools[{position}].function.parameters must be a JSON "
                        "schema object")
    schema_type = schema.get("type", "object")
    if schema_type != "object":
        raise ToolError(f"{problem}: it must describe an object (type 'object'), got "
                        f"{schema_type!r}")
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        raise ToolError(f"{problem}: {e.message}") from None
    except RecursionError:
        raise ToolError(f"Tool {position} function 'parameters' schema is too deeply nested "
                        "or contains a cycle.") from None


def parse_tools(tools: object) -> list[ToolSpec]:
    """Validate a request's `tools` list; names must be unique."""
    if not isinstance(tools, Sequence) or isinstance(tools, str | bytes):
        raise ToolError("tools must be a list")
    specs = [ToolSpec.from_openai(tool, i) for i, tool in enumerate(tools)]
    names = [spec.name for spec in specs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ToolError(f"tools has more than one function named {duplicates[0]!r}")
    return specs


@dataclass(frozen=True)
class ToolChoice:
    """What the model may or must call.

    mode: "none" (no tools), "auto" (text or calls), "required" (at least one call),
    "named" (exactly one call of `name`).
    """

    mode: Literal["none", "auto", "required", "named"]
    name: str | None = None

    @classmethod
    def from_openai(cls, value: object, tools: Sequence[ToolSpec]) -> ToolChoice:
        """Validate `tool_choice` ("none" | "auto" | "required" | {"type": "function",
        "function": {"name"}}; None means "auto", as OpenAI does when tools are given)."""
        if value is None or value == "auto":
            return cls("auto")
        if value == "none":
            return cls("none")
        if value == "required":
            if not tools:
                raise ToolError("Tools cannot be empty if tool choice is set to required.",
                                "tool_choice")
            return cls("required")
        if isinstance(value, Mapping):
            function = value.get("function")
            name = function.get("name") if isinstance(function, Mapping) else None
            if value.get("type") != "function" or not isinstance(name, str):
                raise ToolError(
                    'tool_choice object must be {"type": "function", "function": {"name": ...}}',
                    "tool_choice")
            if not tools:
                raise ToolError("Tools cannot be empty if tool choice is set to a specific "
                                "tool.", "tool_choice")
            if name not in {tool.name for tool in tools}:
                raise ToolError(f"Tool '{name}' not found in tools list.", "tool_choice")
            return cls("named", name)
        raise ToolError(
            f"tool_choice must be 'none', 'auto', 'required' or a named function, got {value!r}",
            "tool_choice")

    def allowed_tools(self, tools: Sequence[ToolSpec]) -> list[ToolSpec]:
        """The tools a call may name under this choice."""
        if self.mode == "none":
            return []
        if self.mode == "named":
            return [tool for tool in tools if tool.name == self.name]
        return list(tools)


class ToolCall(NamedTuple):
    """One parsed call: the function name and its arguments as JSON text (an object)."""

    name: str
    arguments: str


class ParseResult(NamedTuple):
    """A whole output split into the text around the calls and the calls, in order."""

    content: str
    tool_calls: list[ToolCall]


@dataclass(frozen=True)
class ContentDelta:
    """Text for `delta.content`."""

    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """One entry of `delta.tool_calls`.

    The first delta of a call carries `id` and `name`; any following ones carry argument
    fragments only (id and name None). Joined, the fragments of one index are exactly
    that call's final arguments. The parsers send each call as one delta, once complete
    (see stream.py).
    """

    index: int
    id: str | None
    name: str | None
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI chat-completion chunk shape of this delta."""
        function: dict[str, Any] = {"arguments": self.arguments}
        item: dict[str, Any] = {"index": self.index}
        if self.id is not None:
            item["id"] = self.id
            item["type"] = "function"
        if self.name is not None:
            function["name"] = self.name
        item["function"] = function
        return item


StreamDelta = ContentDelta | ToolCallDelta


def new_call_id() -> str:
    """An OpenAI-style call id, `call_` and 24 hex digits."""
    return "call_" + uuid.uuid4().hex[:24]
