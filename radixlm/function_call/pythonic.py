"""Pythonic tool calls (Llama 3.2 / 3.3 / 4 templates): `[get_weather(city="Paris"), now()]`.

A list opens at `[` followed by a name and `(`; each call has keyword
arguments only, their values Python literals (JSON's true / false / null are
read too), turned into a JSON object. Each call is emitted when its `)` closes
(its arguments in one fragment). `<|python_start|>` / `<|python_end|>` around
the list (Llama 4) are markup.
"""

from __future__ import annotations

import ast
import enum
import json
import math
import re
from collections.abc import Sequence
from typing import Any

from radixlm.function_call.base import ToolParser
from radixlm.function_call.call_object import WHITESPACE, CallArgs, CallEnd, CallStart
from radixlm.function_call.grammar_ir import Lit, Node, Tag, Triggered, seq
from radixlm.function_call.json_scan import Step
from radixlm.function_call.pythonic_schema import kwargs_grammar, py_literal
from radixlm.function_call.stream import Block
from radixlm.function_call.types import ToolCall, ToolSpec

PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"
_NAME_START = re.compile(r"[A-Za-z_]")
_NAME_CHAR = re.compile(r"[A-Za-z0-9_.\-]")
_MAX_NAME = 64
_CLOSERS = {"(": ")", "[": "]", "{": "}"}
_JSON_NAMES = {"true": True, "false": False, "null": None}


class _Phase(enum.Enum):
    OPEN = "open"  # "["
    CALL = "call"  # whitespace, then a name
    NAME = "name"
    ARGS = "args"  # inside the parentheses
    AFTER_CALL = "after_call"  # "," or "]"
    END = "end"  # after "]": whitespace, then maybe <|python_end|>


class PythonicBlock(Block):
    def __init__(self, tool_names: frozenset[str] | None, *, end_marker: str = "") -> None:
        super().__init__()
        self._tool_names = tool_names
        self._end_marker = end_marker
        self._phase = _Phase.OPEN
        self._name = ""
        self._args = ""
        self._brackets: list[str] = []
        self._quote = ""  # the open string's quote character
        self._escape = False
        self._end_matched = ""

    def push(self, ch: str) -> Step:
        phase = self._phase
        if phase is _Phase.OPEN:
            if ch in WHITESPACE and self._end_marker:
                return Step.MORE
            if ch != "[":
                return Step.FAIL
            self._phase = _Phase.CALL
            return Step.MORE
        if phase is _Phase.CALL:
            if ch in WHITESPACE:
                return Step.MORE
            if not _NAME_START.fullmatch(ch):
                return Step.FAIL
            self._phase, self._name = _Phase.NAME, ch
            return Step.MORE
        if phase is _Phase.NAME:
            if ch == "(":
                if self._tool_names is not None and self._name not in self._tool_names:
                    return Step.FAIL
                self._phase, self._args = _Phase.ARGS, ""
                return Step.MORE
            if not _NAME_CHAR.fullmatch(ch) or len(self._name) >= _MAX_NAME:
                return Step.FAIL
            self._name += ch
            return Step.MORE
        if phase is _Phase.ARGS:
            return self._push_args(ch)
        if phase is _Phase.AFTER_CALL:
            if ch in WHITESPACE:
                return Step.MORE
            if ch == ",":
                self._phase = _Phase.CALL
                return Step.MORE
            if ch != "]":
                return Step.FAIL
            if not self._end_marker:
                return Step.DONE
            self._phase = _Phase.END
            return Step.MORE
        return self._push_end(ch)

    def _push_args(self, ch: str) -> Step:
        if self._quote:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == self._quote:
                self._quote = ""
        elif ch in "\"'":
            self._quote = ch
        elif ch in _CLOSERS:
            self._brackets.append(_CLOSERS[ch])
        elif ch in ")]}":
            if not self._brackets and ch == ")":
                return self._end_call()
            if not self._brackets or self._brackets.pop() != ch:
                return Step.FAIL
        self._args += ch
        return Step.MORE

    def _end_call(self) -> Step:
        arguments = parse_kwargs(self._args)
        if arguments is None:
            return Step.FAIL
        self.events.append(CallStart(self._name))
        self.events.append(CallArgs(arguments))
        self.events.append(CallEnd())
        self._phase = _Phase.AFTER_CALL
        return Step.MORE

    def _push_end(self, ch: str) -> Step:
        if not self._end_matched and ch in WHITESPACE:
            return Step.MORE
        if self._end_marker[len(self._end_matched)] != ch:
            return Step.DONE_BEFORE if not self._end_matched else Step.FAIL
        self._end_matched += ch
        return Step.DONE if self._end_matched == self._end_marker else Step.MORE

    def finish(self) -> bool:
        # A list whose "]" is missing at the end of the text (a stop string) still counts.
        return self._phase in (_Phase.END, _Phase.AFTER_CALL)


def parse_kwargs(text: str) -> str | None:
    """`a=1, b="x"` as a JSON object text, or None if it is not keyword literals."""
    try:
        tree = ast.parse(f"_f({text})", mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    call = tree.body
    if not isinstance(call, ast.Call) or call.args:
        return None
    arguments: dict[str, Any] = {}
    for keyword in call.keywords:
        if keyword.arg is None or keyword.arg in arguments:
            return None
        try:
            arguments[keyword.arg] = _literal(keyword.value)
        except ValueError:
            return None
    return json.dumps(arguments, ensure_ascii=False)


def _literal(node: ast.expr) -> Any:
    """A JSON value from a Python literal node; ValueError for anything else."""
    if isinstance(node, ast.Constant):
        value = node.value
        if value is None or isinstance(value, bool | str):
            return value
        if isinstance(value, int | float) and math.isfinite(value):
            return value
        raise ValueError("not a JSON value")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _literal(node.operand)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("sign on a non-number")
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        result = {}
        for key_node, value_node in zip(node.keys, node.values):
            if key_node is None:
                raise ValueError("** in a dict")
            name = _literal(key_node)
            if not isinstance(name, str):
                raise ValueError("a dict key that is not a string")
            result[name] = _literal(value_node)
        return result
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    raise ValueError("not a literal")


class PythonicParser(ToolParser):
    name = "pythonic"
    markers = (PYTHON_START,)
    markup = (PYTHON_START, PYTHON_END)

    def open_marker(self, marker: str) -> Block:
        return PythonicBlock(self.tool_names, end_marker=PYTHON_END)

    def open_inline(self, ch: str, at_start: bool) -> Block | None:
        return PythonicBlock(self.tool_names) if ch == "[" else None

    def render(self, content: str, calls: Sequence[ToolCall]) -> str:
        if not calls:
            return content
        rendered = []
        for call in calls:
            arguments = json.loads(call.arguments)
            kwargs = ", ".join(f"{k}={py_literal(v)}" for k, v in arguments.items())
            rendered.append(f"{call.name}({kwargs})")
        return f"{content}[{', '.join(rendered)}]"

    def call_grammar(self, tool: ToolSpec) -> Node:
        kwargs = kwargs_grammar(tool.object_schema, f"the parameters of {tool.name!r}")
        return seq(Lit(f"{tool.name}("), kwargs, Lit(")"))

    def calls_grammar(self, tools: Sequence[ToolSpec], max_calls: int | None) -> Node:
        return seq(Lit("["), self._call_list(tools, ", ", max_calls), Lit("]"))

    def auto_grammar(self, tools: Sequence[ToolSpec], max_calls: int | None) -> Node:
        calls = self._call_list(tools, ", ", max_calls)
        return Triggered(("[",), (Tag("[", calls, "]"),), stop_after_first=True)
