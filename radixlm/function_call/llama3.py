"""Llama 3.1 / 3.2 / 3.3 JSON tool calls: `{"name": ..., "parameters": {...}}`.

A call is the whole output starting with `{` (after whitespace) or follows
`<|python_tag|>`; several calls are joined by `;`. "arguments" is accepted for
"parameters"; an object with any other key is not a call (it stays content,
so a plain JSON answer is not mistaken for one).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from radixlm.function_call.base import ToolParser
from radixlm.function_call.call_object import WHITESPACE, CallObjectReader
from radixlm.function_call.grammar_ir import Json, Lit, Node, Regex, Tag, Triggered, alt, seq
from radixlm.function_call.json_scan import Step
from radixlm.function_call.stream import Block
from radixlm.function_call.types import ToolCall, ToolSpec

PYTHON_TAG = "<|python_tag|>"
SEPARATOR = "; "


class Llama3Block(Block):
    """Call objects separated by `;`; ends before any other text."""

    def __init__(self, tool_names: frozenset[str] | None) -> None:
        super().__init__()
        self._tool_names = tool_names
        self._call = self._new_call()
        self._after = ""  # text read after a complete call: whitespace, then maybe ";"

    def _new_call(self) -> CallObjectReader:
        return CallObjectReader(
            self.events, tool_names=self._tool_names, args_keys=("parameters", "arguments"),
            extra_keys=False,
        )

    def push(self, ch: str) -> Step:
        if not self._call.finished:
            if self._after and not self._call.started:  # after a ";"
                if ch in WHITESPACE:
                    self._after += ch
                    return Step.MORE
                if ch != "{":  # not a call: the block ended before the ";"
                    self.pushback = self._after
                    return Step.DONE_BEFORE
            step = self._call.push(ch)
            if step is Step.FAIL:
                return step
            if self._call.started:
                self._after = ""
            return Step.MORE
        if ch in WHITESPACE or ch == ";":
            self._after += ch
            if ch == ";":
                self._call = self._new_call()
            return Step.MORE
        self.pushback = self._after  # whitespace after the last call
        return Step.DONE_BEFORE

    def finish(self) -> bool:
        # A trailing ";" (nothing after it) is a separator: markup, dropped.
        return self._call.finished or (bool(self._after) and not self._call.started)


class Llama3Parser(ToolParser):
    name = "llama3"
    markers = (PYTHON_TAG,)
    markup = (PYTHON_TAG,)

    def open_marker(self, marker: str) -> Block:
        return Llama3Block(self.tool_names)

    def open_inline(self, ch: str, at_start: bool) -> Block | None:
        return Llama3Block(self.tool_names) if ch == "{" and at_start else None

    def render(self, content: str, calls: Sequence[ToolCall]) -> str:
        text = SEPARATOR.join(
            f'{{"name": {json.dumps(c.name)}, "parameters": {c.arguments}}}' for c in calls
        )
        if content and calls:
            return content + PYTHON_TAG + text
        return content + text

    def _begin(self, tool: ToolSpec) -> str:
        return f'{{"name": {json.dumps(tool.name)}, "parameters": '

    def call_grammar(self, tool: ToolSpec) -> Node:
        return seq(Lit(self._begin(tool)), Json.of(tool.object_schema), Lit("}"))

    def calls_grammar(self, tools: Sequence[ToolSpec], max_calls: int | None) -> Node:
        return self._call_list(tools, SEPARATOR, max_calls)

    def auto_grammar(self, tools: Sequence[ToolSpec], max_calls: int | None) -> Node:
        # Either the output is calls (it starts with "{"), or it is text that does not start
        # with "{" (nor with whitespace, which could precede one), where <|python_tag|>
        # must begin the calls.
        opens = alt(*(seq(Lit(self._begin(t)), Json.of(t.object_schema)) for t in tools))
        tags = tuple(
            self._chained_tag(Tag(PYTHON_TAG + self._begin(tool), Json.of(tool.object_schema), "}"),
                              opens, SEPARATOR, max_calls)
            for tool in tools
        )
        text = seq(Regex("[^{ \\t\\n\\r]"), Triggered((PYTHON_TAG,), tags, stop_after_first=True))
        return alt(self.calls_grammar(tools, max_calls), text)
