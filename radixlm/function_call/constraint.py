"""Render a tool-call grammar (grammar_ir) as the constraint a grammar backend compiles.

The result is a `GrammarConstraint(kind, text)`: the sampling parameter to set
(`sampling_params[kind] = text`), in the forms radixlm's backends read today:

- xgrammar: `structural_tag` in xgrammar's own format (`{"type": "structural_tag",
  "format": ...}`); JSON parts are xgrammar's EBNF for the schema with fixed
  separators, as the json_schema kind writes them.
- llguidance: `ebnf` holding a Lark grammar (`start: ...`, passed through
  as Lark); JSON parts are `%json` with the same separators; markup that is
  one token of the tokenizer is named by its id (`<[151657]>`); free text
  never holds a trigger.
- outlines: `regex` (JSON parts from outlines-core's schema-to-regex, compact);
  free text with triggers (tool_choice auto) cannot be expressed.

A tree that is one Json node becomes the `json_schema` kind on every backend.
NOTE: the grammar libraries are imported where used (this runs in the HTTP
process, which must not wait for them at start-up). JSON numbers are bounded as the backends bound them for json_schema
(constrained/json_bounds.py) unless `bounded_numbers` is False.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from radixlm.constrained.json_bounds import (
    bound_outlines_regex,
    bound_schema,
    xgrammar_json_ebnf,
)
from radixlm.function_call.grammar_ir import (
    Alt,
    Json,
    Lit,
    Node,
    Opt,
    Regex,
    Repeat,
    Seq,
    Tag,
    Triggered,
    seq,
)
from radixlm.function_call.types import ToolConstraintError

JSON_SEPARATORS = (", ", ": ")
_REGEX_META = set("\\.+*?()|[]{}^$#&-~/")


class GrammarConstraint(NamedTuple):
    """A grammar in the terms of radixlm's sampling parameters (kind: regex, json_schema,
    ebnf or structural_tag)."""

    kind: str
    text: str


def render_constraint(
    node: Node, backend: str, marker_token_ids: Mapping[str, int] | None = None,
    bounded_numbers: bool = True,
) -> GrammarConstraint:
    """The constraint for `node` on the named grammar backend; ToolConstraintError if that
    backend cannot express it.

    marker_token_ids: markup strings that are one (special or added) token of the
    tokenizer, and their ids. llguidance matches such a token only by its id (its text
    is not text to it), so its grammar names them so; xgrammar matches them as text, and
    outlines only spelled out (its vocabulary leaves special tokens out).
    """
    if isinstance(node, Json):
        if backend == "none":
            raise ToolConstraintError("Tool-call constraints need a grammar backend (not 'none')")
        return GrammarConstraint("json_schema", node.schema_json)
    if backend == "xgrammar":
        tag = {"type": "structural_tag", "format": _XGrammar(bounded_numbers).format(node)}
        return GrammarConstraint("structural_tag", json.dumps(tag, ensure_ascii=False))
    if backend == "llguidance":
        lark = _Lark(marker_token_ids or {}, bounded_numbers)
        return GrammarConstraint("ebnf", lark.grammar(node))
    if backend == "outlines":
        return GrammarConstraint("regex", _regex(node, bounded_numbers))
    raise ToolConstraintError(
        f"The {backend} grammar backend cannot constrain tool calls of this format"
    )


# -- xgrammar ---------------------------------------------------------------------------------


class _XGrammar:
    def __init__(self, bounded_numbers: bool) -> None:
        self._json_cache: dict[str, str] = {}
        self._bounded = bounded_numbers

    def format(self, node: Node) -> dict[str, Any]:
        if isinstance(node, Lit):
            return {"type": "const_string", "value": node.text}
        if isinstance(node, Regex):
            return {"type": "regex", "pattern": node.pattern}
        if isinstance(node, Json):
            return {"type": "grammar", "grammar": self._json_ebnf(node.schema_json)}
        if isinstance(node, Seq):
            return {"type": "sequence", "elements": [self.format(n) for n in node.items]}
        if isinstance(node, Alt):
            return {"type": "or", "elements": [self.format(n) for n in node.items]}
        if isinstance(node, Opt):
            return {"type": "optional", "content": self.format(node.item)}
        if isinstance(node, Repeat):
            return self._repeat(node)
        assert isinstance(node, Triggered)
        return {
            "type": "triggered_tags",
            "triggers": list(node.triggers),
            "tags": [self._tag(tag) for tag in node.tags],
            "at_least_one": False,
            "stop_after_first": node.stop_after_first,
        }

    def _repeat(self, node: Repeat) -> dict[str, Any]:
        """`item` then `(sep item)` between min_items - 1 and max_items - 1 times."""
        head = self.format(node.item)
        if node.max_items == 1:
            return head
        tail = seq(Lit(node.sep), node.item) if node.sep else node.item
        max_tail = -1 if node.max_items is None else node.max_items - 1
        more = {"type": "repeat", "min": node.min_items - 1, "max": max_tail,
                "content": self.format(tail)}
        return {"type": "sequence", "elements": [head, more]}

    def _tag(self, tag: Tag) -> dict[str, Any]:
        return {"type": "tag", "begin": tag.begin, "content": self.format(tag.content), "end": tag.end}

    def _json_ebnf(self, schema_json: str) -> str:
        if schema_json not in self._json_cache:
            try:
                ebnf = xgrammar_json_ebnf(schema_json, JSON_SEPARATORS, self._bounded)
            except Exception as e:  # xgrammar raises RuntimeError / ValueError on bad schemas
                raise ToolConstraintError(f"Cannot build a grammar for the tool schema: {e}") from e
            self._json_cache[schema_json] = ebnf
        return self._json_cache[schema_json]


# -- llguidance (Lark) ------------------------------------------------------------------------


class _Lark:
    def __init__(self, special: Mapping[str, int], bounded_numbers: bool) -> None:
        self._special = dict(special)
        self._bounded = bounded_numbers
        self._split = (
            re.compile("(" + "|".join(re.escape(m) for m in sorted(special, key=len, reverse=True)) + ")")
            if special else None
        )
        self._rules: list[str] = []
        self._num_rules = 0

    def _lit(self, text: str) -> str:
        """A literal; markup that is one token of the tokenizer is named by its id."""
        if self._split is None:
            return json.dumps(text)
        parts = [p for p in self._split.split(text) if p]
        return " ".join(f"<[{self._special[p]}]>" if p in self._special else json.dumps(p) for p in parts)

    def grammar(self, node: Node) -> str:
        start = self.expr(node)
        return "\n".join(["%llguidance {}", f"start: {start}", *self._rules, ""])

    def _new_name(self, prefix: str) -> str:
        self._num_rules += 1
        return f"{prefix}{self._num_rules}"

    def expr(self, node: Node) -> str:
        if isinstance(node, Lit):
            return self._lit(node.text)
        if isinstance(node, Regex):
            return "/" + node.pattern.replace("/", "\\/") + "/"
        if isinstance(node, Json):
            name = self._new_name("json")
            schema = bound_schema(node.schema, "llguidance") if self._bounded else node.schema
            guidance = {"whitespace_flexible": False, "item_separator": JSON_SEPARATORS[0],
                        "key_separator": JSON_SEPARATORS[1]}
            schema["x-guidance"] = guidance
            self._rules.append(f"{name}: %json {json.dumps(schema, ensure_ascii=False)}")
            return name
        if isinstance(node, Seq):
            return "(" + " ".join(self.expr(n) for n in node.items) + ")"
        if isinstance(node, Alt):
            return "(" + " | ".join(self.expr(n) for n in node.items) + ")"
        if isinstance(node, Opt):
            return "(" + self.expr(node.item) + ")?"
        if isinstance(node, Repeat):
            return self._repeat(node)
        assert isinstance(node, Triggered)
        return self._triggered(node)

    def _repeat(self, node: Repeat) -> str:
        item = self.expr(node.item)
        tail = f"({self._lit(node.sep)} {item})" if node.sep else item
        heads = " ".join([item] + [tail] * (node.min_items - 1))
        if node.max_items is None:
            return f"({heads} {tail}*)"
        optional = ""
        for _ in range(node.max_items - node.min_items):
            optional = f"({tail} {optional})?" if optional else f"({tail})?"
        return f"({heads} {optional})"

    def _triggered(self, node: Triggered) -> str:
        # Free text never holds a trigger: at the end (TEXT), nor before a special-token
        # trigger (TEXT again: the token's bytes are not text to llguidance, so the text
        # ends there). Before a trigger spelled as text, a lazy lexeme ends at its first
        # occurrence (a greedy one would have read past it).
        text = self._new_name("TEXT")
        excluded = "|".join(_regex_escape(t) for t in node.triggers)
        self._rules.append(f"{text}: /(.|\\n)*/ & ~/(.|\\n)*({excluded})(.|\\n)*/")
        segments = []
        for trigger in node.triggers:
            bodies = [self.expr(_tag_body(tag, len(trigger))) for tag in node.tags
                      if tag.begin.startswith(trigger)]
            if not bodies:
                continue
            if trigger in self._special:
                head = f"{text} <[{self._special[trigger]}]>"
            else:
                head = self._new_name("trig")
                self._rules.append(f"{head}[lazy]: /(.|\\n)*/ {json.dumps(trigger)}")
            segments.append(f"{head} ({' | '.join(bodies)})")
        segment = self._new_name("seg")
        self._rules.append(f"{segment}: {' | '.join(segments)}")
        if node.stop_after_first:
            return f"({text} | {segment})"
        return f"({segment}* {text})"


def _tag_body(tag: Tag, skip: int) -> Node:
    """What follows the trigger: the rest of `begin`, the content, `end`."""
    parts = [Lit(tag.begin[skip:]), tag.content, Lit(tag.end)]
    kept = tuple(p for p in parts if not (isinstance(p, Lit) and not p.text))
    return kept[0] if len(kept) == 1 else Seq(kept)


# -- outlines (regex) -------------------------------------------------------------------------


def _regex(node: Node, bounded: bool) -> str:
    if isinstance(node, Lit):
        return _regex_escape(node.text)
    if isinstance(node, Regex):
        return f"(?:{node.pattern})"
    if isinstance(node, Json):
        from outlines_core.json_schema import build_regex_from_schema

        try:
            regex = build_regex_from_schema(node.schema_json, whitespace_pattern="")
        except Exception as e:  # outlines-core raises ValueError / its own errors
            raise ToolConstraintError(f"outlines cannot express the tool schema: {e}") from e
        return f"(?:{bound_outlines_regex(regex) if bounded else regex})"
    if isinstance(node, Seq):
        return "".join(_regex(n, bounded) for n in node.items)
    if isinstance(node, Alt):
        return "(?:" + "|".join(_regex(n, bounded) for n in node.items) + ")"
    if isinstance(node, Opt):
        return f"(?:{_regex(node.item, bounded)})?"
    if isinstance(node, Repeat):
        item = _regex(node.item, bounded)
        tail = f"(?:{_regex_escape(node.sep)}{item})" if node.sep else f"(?:{item})"
        low = node.min_items - 1
        high = "" if node.max_items is None else str(node.max_items - 1)
        return f"{item}{tail}{{{low},{high}}}"
    raise ToolConstraintError(
        "The outlines grammar backend cannot constrain tool calls inside free text "
        "(tool_choice 'auto' with a trigger); use xgrammar or llguidance"
    )


def _regex_escape(text: str) -> str:
    out = []
    for ch in text:
        if ch in _REGEX_META:
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)
