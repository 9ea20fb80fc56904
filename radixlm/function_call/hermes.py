"""Hermes / Qwen2.5 / Qwen3 tool calls: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.

Several calls are several blocks. A last block whose `</tool_call>` is missing
(generation stopped on it as a stop string) still counts when its JSON is
complete. Anything inside the block but the call object is malformed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from radixlm.function_call.base import ToolParser
from radixlm.function_call.call_object import WHITESPACE, CallObjectReader
from radixlm.function_call.grammar_ir import Json, Lit, Node, Tag, Triggered, alt, seq
from radixlm.function_call.json_scan import Step
from radixlm.function_call.stream import Block
from radixlm.function_call.types import ToolCall, ToolSpec

START, END = "<tool_call>", "</tool_call>"


class HermesBlock(Block):
    """`{call object}` then `</tool_call>` (whitespace around both)."""

    def __init__(self, tool_names: frozenset[str] | None) -> None:
        super().__init__()
        self._call = CallObjectReader(self.events, tool_names=tool_names)
        self._end_matched = ""

    def push(self, ch: str) -> Step:
        if not self._call.finished:
            step = self._call.push(ch)
            return Step.FAIL if step is Step.FAIL else Step.MORE
        if not self._end_matched and ch in WHITESPACE:
            return Step.MORE
        if END[len(self._end_matched)] != ch:
            return Step.FAIL
        self._end_matched += ch
        return Step.DONE if self._end_matched == END else Step.MORE

    def finish(self) -> bool:
        return self._call.finished


class HermesParser(ToolParser):
    name = "hermes"
    markers = (START,)
    markup = (START, END)

    def open_marker(self, marker: str) -> Block:
        return HermesBlock(self.tool_names)

    def render(self, content: str, calls: Sequence[ToolCall]) -> str:
        blocks = [
            f'{START}\n{{"name": {json.dumps(c.name)}, "arguments": {c.arguments}}}\n{END}'
            for c in calls
        ]
        if content and blocks:
            return content + "\n" + "\n".join(blocks)
        return content + "\n".join(blocks)

    def _tag(self, tool: ToolSpec) -> Tag:
        return Tag(
            begin=f'{START}\n{{"name": {json.dumps(tool.name)}, "arguments": ',
            content=Json.of(tool.object_schema),
            end=f"}}\n{END}",
        )

    def call_grammar(self, tool: ToolSpec) -> Node:
        tag = self._tag(tool)
        return seq(Lit(tag.begin), tag.content, Lit(tag.end))

    def calls_grammar(self, tools: Sequence[ToolSpec], max_calls: int | None) -> Node:
        return self._call_list(tools, "\n", max_calls)

    def auto_grammar(self, tools: Sequence[ToolSpec], max_calls: int | None) -> Node:
        # The first call's tag holds the calls after it: at most max_calls in all.
        opens = alt(*(seq(Lit(t.begin), t.content) for t in map(self._tag, tools)))
        tags = tuple(self._chained_tag(self._tag(tool), opens, "\n", max_calls) for tool in tools)
        return Triggered((START,), tags, stop_after_first=True)
