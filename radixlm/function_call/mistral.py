"""Mistral tool calls: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`.

Also read: the newer form of Mistral Small 3.2 / Magistral / Devstral,
`[TOOL_CALLS]name[ARGS]{...}` (optionally `[CALL_ID]id` before `[ARGS]`), one
call per `[TOOL_CALLS]`. Written (render, grammar): the array form.

NOTE: `[TOOL_CALLS]` is a special token in Mistral tokenizers; the parser must
see it, so the detokenizer keeps special tokens when this parser is on.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Sequence

from radixlm.function_call.base import ToolParser
from radixlm.function_call.call_object import (
    WHITESPACE,
    ArgumentsReader,
    CallArgs,
    CallArrayReader,
    CallEnd,
    CallStart,
)
from radixlm.function_call.grammar_ir import Json, Lit, Node, Tag, Triggered, seq
from radixlm.function_call.json_scan import Step
from radixlm.function_call.stream import Block
from radixlm.function_call.types import ToolCall, ToolSpec

TOOL_CALLS = "[TOOL_CALLS]"
ARGS, CALL_ID = "[ARGS]", "[CALL_ID]"
_NAME_CHAR = re.compile(r"[A-Za-z0-9_.\-]")
_MAX_NAME = 64


class _Phase(enum.Enum):
    START = "start"
    ARRAY = "array"
    NAME = "name"
    TAG = "tag"  # inside "[ARGS]" or "[CALL_ID]"
    CALL_ID = "call_id"
    ARGUMENTS = "arguments"


class MistralBlock(Block):
    def __init__(self, tool_names: frozenset[str] | None) -> None:
        super().__init__()
        self._tool_names = tool_names
        self._phase = _Phase.START
        self._array = CallArrayReader(self.events, tool_names=tool_names)
        self._name = ""
        self._tag = ""
        self._args = ArgumentsReader()
        self._call_id_seen = False
        self._started = False

    def push(self, ch: str) -> Step:
        phase = self._phase
        if phase is _Phase.START:
            if ch in WHITESPACE:
                return Step.MORE
            if ch == "[":
                self._phase = _Phase.ARRAY
                return self._array.push(ch)
            self._phase = _Phase.NAME
        if phase is _Phase.ARRAY:
            return self._array.push(ch)
        if self._phase is _Phase.NAME:
            if ch == "[" and self._name:
                if self._tool_names is not None and self._name not in self._tool_names:
                    return Step.FAIL
                self._phase, self._tag = _Phase.TAG, ch
                return Step.MORE
            if not _NAME_CHAR.fullmatch(ch) or len(self._name) >= _MAX_NAME:
                return Step.FAIL
            self._name += ch
            return Step.MORE
        if phase is _Phase.TAG:
            return self._push_tag(ch)
        if phase is _Phase.CALL_ID:
            if ch == "[":
                self._phase, self._tag = _Phase.TAG, ch
                return Step.MORE
            return Step.MORE if _NAME_CHAR.fullmatch(ch) else Step.FAIL
        return self._push_arguments(ch)

    def _push_tag(self, ch: str) -> Step:
        tag = self._tag + ch
        if tag == ARGS:
            self._phase = _Phase.ARGUMENTS
        elif tag == CALL_ID and not self._call_id_seen:
            self._phase, self._call_id_seen = _Phase.CALL_ID, True
        elif not (ARGS.startswith(tag) or CALL_ID.startswith(tag)):
            return Step.FAIL
        self._tag = tag
        return Step.MORE

    def _push_arguments(self, ch: str) -> Step:
        step = self._args.push(ch)
        if step is Step.FAIL:
            return step
        if self._args.started and not self._started:
            self.events.append(CallStart(self._name))
            self._started = True
        new = self._args.take()
        if new:
            self.events.append(CallArgs(new))
        if step is Step.DONE:
            self.events.append(CallEnd())
        return step

    def finish(self) -> bool:
        # An array whose "]" is missing at the end of the text (a stop string) still counts.
        return self._phase is _Phase.ARRAY and self._array.can_finish()


class MistralParser(ToolParser):
    name = "mistral"
    markers = (TOOL_CALLS,)
    markup = (TOOL_CALLS, ARGS, CALL_ID)

    def open_marker(self, marker: str) -> Block:
        return MistralBlock(self.tool_names)

    def render(self, content: str, calls: Sequence[ToolCall]) -> str:
        if not calls:
            return content
        objects = ", ".join(self._object(c.name, c.arguments) for c in calls)
        return f"{content}{TOOL_CALLS} [{objects}]"

    @staticmethod
    def _object(name: str, arguments: str) -> str:
        return f'{{"name": {json.dumps(name)}, "arguments": {arguments}}}'

    def call_grammar(self, tool: ToolSpec) -> Node:
        begin = f'{{"name": {json.dumps(tool.name)}, "arguments": '
        return seq(Lit(begin), Json.of(tool.object_schema), Lit("}"))

    def calls_grammar(self, tools: Sequence[ToolSpec], max_calls: int | None) -> Node:
        return seq(Lit(f"{TOOL_CALLS} ["), self._call_list(tools, ", ", max_calls), Lit("]"))

    def auto_grammar(self, tools: Sequence[ToolSpec], max_calls: int | None) -> Node:
        calls = self._call_list(tools, ", ", max_calls)
        tag = Tag(f"{TOOL_CALLS} [", calls, "]")
        return Triggered((TOOL_CALLS,), (tag,), stop_after_first=True)
