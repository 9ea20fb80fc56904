"""Phi-4-mini tool calls: `functools[{"name": ..., "arguments": {...}}, ...]`.

The format Microsoft documents for Phi-4-mini-instruct (SGLang's and vLLM's
phi4_mini parsers read the same): the marker `functools` followed at once by a
JSON array of calls, no closing marker. Phi-4-mini's chat template reads the
tools from the system message's `tools` field (a JSON string), not from the
template's `tools` argument: `system_message_tools` tells the chat layer to put
them there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import ClassVar

from radixlm.function_call.base import ToolParser
from radixlm.function_call.call_object import CallArrayReader
from radixlm.function_call.grammar_ir import Json, Lit, Node, Tag, Triggered, seq
from radixlm.function_call.json_scan import Step
from radixlm.function_call.stream import Block
from radixlm.function_call.types import ToolCall, ToolSpec

FUNCTOOLS = "functools"


class Phi4MiniBlock(Block):
    """After `functools`: a JSON array of call objects, starting with "[" at once."""

    def __init__(self, tool_names: frozenset[str] | None) -> None:
        super().__init__()
        self._array = CallArrayReader(self.events, tool_names=tool_names)
        self._started = False

    def push(self, ch: str) -> Step:
        if not self._started:
            if ch != "[":
                return Step.FAIL
            self._started = True
        return self._array.push(ch)

    def finish(self) -> bool:
        # An array whose "]" is missing at the end of the text (a stop string) still counts.
        return self._started and self._array.can_finish()


class Phi4MiniParser(ToolParser):
    name = "phi4_mini"
    markers = (FUNCTOOLS,)
    # The chat layer writes the tools into the system message's `tools` field.
    system_message_tools: ClassVar[bool] = True

    def open_marker(self, marker: str) -> Block:
        return Phi4MiniBlock(self.tool_names)

    def render(self, content: str, calls: Sequence[ToolCall]) -> str:
        if not calls:
            return content
        objects = ", ".join(f'{{"name": {json.dumps(c.name)}, "arguments": {c.arguments}}}'
                            for c in calls)
        return f"{content}{FUNCTOOLS}[{objects}]"

    def call_grammar(self, tool: ToolSpec) -> Node:
        begin = f'{{"name": {json.dumps(tool.name)}, "arguments": '
        return seq(Lit(begin), Json.of(tool.object_schema), Lit("}"))

    def calls_grammar(self, tools: Sequence[ToolSpec], max_calls: int | None) -> Node:
        return seq(Lit(f"{FUNCTOOLS}["), self._call_list(tools, ", ", max_calls), Lit("]"))

    def auto_grammar(self, tools: Sequence[ToolSpec], max_calls: int | None) -> Node:
        calls = self._call_list(tools, ", ", max_calls)
        tag = Tag(f"{FUNCTOOLS}[", calls, "]")
        return Triggered((f"{FUNCTOOLS}[",), (tag,), stop_after_first=True)
