"""The generic tool-call format, for models whose chat template has no place for tools.

As llama.cpp's generic style: a system prompt lists the tools (see
generic_prompt.py) and the whole answer is one JSON object,

    {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}
    {"content": "Paris is sunny today."}

("response" is read as "content", and "tool_call" holding one call as
"tool_calls"). The model was never trained on this, so the grammar is what
makes it work: tool_choice auto is constrained too (an answer is either form),
and on every backend (it is a JSON schema).

A tool whose parameters use `$ref` (nested pydantic models: `$defs`, or
`definitions`) sits whole under the wrapper's own `$defs`, named after the
tool, with its references rewritten to that place (schema_refs.py), so they
resolve against the tool's own definitions and not against the wrapper.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from typing import Any

from radixlm.function_call.base import ToolParser
from radixlm.function_call.call_object import (
    WHITESPACE,
    CallArrayReader,
    CallObjectReader,
    Content,
    KeyReader,
)
from radixlm.function_call.grammar_ir import Json, Node
from radixlm.function_call.json_scan import JsonStringDecoder, Step
from radixlm.function_call.schema_refs import escape_pointer_token, has_local_ref, relocate
from radixlm.function_call.stream import Block
from radixlm.function_call.types import ToolCall, ToolSpec

CONTENT_KEYS = ("content", "response")
CALLS_KEY, CALL_KEY = "tool_calls", "tool_call"


class _Phase(enum.Enum):
    OPEN = "open"
    KEY_OR_CLOSE = "key_or_close"
    KEY = "key"
    COLON = "colon"
    VALUE = "value"
    AFTER_VALUE = "after_value"


class GenericBlock(Block):
    """`{"content": "..."}` and / or `{"tool_calls": [...]}`, at the start of the output."""

    def __init__(self, tool_names: frozenset[str] | None) -> None:
        super().__init__()
        self._tool_names = tool_names
        self._phase = _Phase.OPEN
        self._key: KeyReader | None = None
        self._current = ""
        self._seen: set[str] = set()
        self._reader: JsonStringDecoder | CallArrayReader | CallObjectReader | None = None

    def push(self, ch: str) -> Step:
        phase = self._phase
        if phase is _Phase.VALUE:
            return self._push_value(ch)
        if self._key is not None:
            return self._push_key(ch)
        if ch in WHITESPACE:
            return Step.MORE
        if phase is _Phase.OPEN:
            if ch != "{":
                return Step.FAIL
            self._phase = _Phase.KEY_OR_CLOSE
            return Step.MORE
        if phase in (_Phase.KEY_OR_CLOSE, _Phase.KEY):
            self._key = KeyReader()
            return self._push_key(ch)
        if phase is _Phase.COLON:
            if ch != ":":
                return Step.FAIL
            self._phase = _Phase.VALUE
            return Step.MORE
        if ch == ",":
            self._phase = _Phase.KEY
            return Step.MORE
        return Step.DONE if ch == "}" else Step.FAIL

    def _push_key(self, ch: str) -> Step:
        assert self._key is not None
        step = self._key.push(ch)
        if step is not Step.DONE:
            return step
        key = self._key.value or ""
        group = "content" if key in CONTENT_KEYS else "calls" if key in (CALLS_KEY, CALL_KEY) else ""
        if not group or group in self._seen:
            return Step.FAIL
        self._seen.add(group)
        self._key, self._current, self._phase = None, key, _Phase.COLON
        return Step.MORE

    def _push_value(self, ch: str) -> Step:
        reader = self._reader
        if reader is None:
            if ch in WHITESPACE:
                return Step.MORE
            reader = self._new_reader(ch)
            if reader is None:
                return Step.FAIL
            self._reader = reader
            if isinstance(reader, JsonStringDecoder):
                return Step.MORE  # the opening quote
        if isinstance(reader, JsonStringDecoder):
            try:
                text = reader.push(ch)
            except ValueError:
                return Step.FAIL
            if text:
                self.events.append(Content(text))
            done = reader.closed
        else:
            step = reader.push(ch)
            if step is Step.FAIL:
                return step
            done = reader.finished
        if done:
            self._reader, self._phase = None, _Phase.AFTER_VALUE
        return Step.MORE

    def _new_reader(self, ch: str) -> JsonStringDecoder | CallArrayReader | CallObjectReader | None:
        if self._current in CONTENT_KEYS:
            return JsonStringDecoder() if ch == '"' else None
        if self._current == CALLS_KEY:
            return CallArrayReader(self.events, tool_names=self._tool_names, min_items=0) if ch == "[" else None
        return CallObjectReader(self.events, tool_names=self._tool_names) if ch == "{" else None


class GenericParser(ToolParser):
    name = "generic"
    constrain_auto = True

    def open_inline(self, ch: str, at_start: bool) -> Block | None:
        return GenericBlock(self.tool_names) if ch == "{" and at_start else None

    def render(self, content: str, calls: Sequence[ToolCall]) -> str:
        parts = []
        if content or not calls:
            parts.append(f'"content": {json.dumps(content, ensure_ascii=False)}')
        if calls:
            objects = ", ".join(
                f'{{"name": {json.dumps(c.name)}, "arguments": {c.arguments}}}' for c in calls
            )
            parts.append(f'"tool_calls": [{objects}]')
        return "{" + ", ".join(parts) + "}"

    @staticmethod
    def _arguments(tool: ToolSpec, defs: dict[str, Any]) -> dict[str, Any]:
        """The schema of the call's "arguments"; a tool with references is put under
        `defs` (the wrapper's root $defs) and referred to."""
        schema = dict(tool.object_schema)
        if not has_local_ref(schema):
            return schema
        pointer = "/$defs/" + escape_pointer_token(tool.name)
        defs[tool.name] = relocate(schema, pointer)
        return {"$ref": "#" + pointer}

    @classmethod
    def _call_object(cls, tool: ToolSpec, defs: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {
                "name": {"type": "string", "const": tool.name},
                "arguments": cls._arguments(tool, defs),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }

    @classmethod
    def call_schema(cls, tool: ToolSpec) -> dict[str, Any]:
        """One call object `{"name": ..., "arguments": {...}}` as a whole schema."""
        defs: dict[str, Any] = {}
        return _with_defs(cls._call_object(tool, defs), defs)

    def _calls_object(self, tools: Sequence[ToolSpec], max_calls: int | None,
                      defs: dict[str, Any]) -> dict[str, Any]:
        schemas = [self._call_object(tool, defs) for tool in tools]
        array: dict[str, Any] = {
            "type": "array",
            "items": schemas[0] if len(schemas) == 1 else {"anyOf": schemas},
            "minItems": 1,
        }
        if max_calls is not None:
            array["maxItems"] = max_calls
        return {
            "type": "object",
            "properties": {CALLS_KEY: array},
            "required": [CALLS_KEY],
            "additionalProperties": False,
        }

    def call_grammar(self, tool: ToolSpec) -> Node:
        return Json.of(self.call_schema(tool))

    def calls_grammar(self, tools: Sequence[ToolSpec], max_calls: int | None) -> Node:
        defs: dict[str, Any] = {}
        return Json.of(_with_defs(self._calls_object(tools, max_calls, defs), defs))

    def auto_grammar(self, tools: Sequence[ToolSpec], max_calls: int | None) -> Node:
        content = {
            "type": "object",
            "properties": {"content": {"type": "string"}},
            "required": ["content"],
            "additionalProperties": False,
        }
        defs: dict[str, Any] = {}
        calls = self._calls_object(tools, max_calls, defs)
        return Json.of(_with_defs({"anyOf": [calls, content]}, defs))


def _with_defs(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    return {"$defs": defs, **schema} if defs else schema
