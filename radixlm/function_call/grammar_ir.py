"""A small grammar language for tool-call constraints, rendered per grammar backend.

Each tool parser describes the text it accepts with these nodes once;
`radixlm.function_call.constraint` renders the tree as an xgrammar structural
tag, an llguidance Lark grammar or an outlines regex.

Semantics (the renderers keep them identical):
- Lit: exactly the text. Regex: a regular expression in the subset every
  backend reads (character classes, groups, * + ? {m,n}; no anchors, no
  look-around, no \\d / \\s). Json: one JSON value following the schema, on
  one line with json.dumps' separators.
- Seq, Alt, Opt: concatenation, choice, zero or one.
- Repeat: `item (sep item)*`, between min_items and max_items times.
- Triggered: free text in which each trigger string must start one of the
  tags (`begin content end`, begin starting with its trigger); free text never
  contains a trigger otherwise. stop_after_first: at most one tag, and nothing
  after it (xgrammar's triggered_tags semantics).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Lit:
    text: str


@dataclass(frozen=True)
class Regex:
    pattern: str


@dataclass(frozen=True)
class Json:
    schema_json: str  # the schema as JSON text (hashable, and what the backends read)

    @classmethod
    def of(cls, schema: Mapping[str, Any]) -> Json:
        return cls(json.dumps(schema, ensure_ascii=False))

    @property
    def schema(self) -> dict[str, Any]:
        value = json.loads(self.schema_json)
        assert isinstance(value, dict)
        return value


@dataclass(frozen=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Opt:
    item: Node


@dataclass(frozen=True)
class Repeat:
    item: Node
    sep: str = ""
    min_items: int = 1
    max_items: int | None = None  # None: unbounded


@dataclass(frozen=True)
class Tag:
    begin: str
    content: Node
    end: str


@dataclass(frozen=True)
class Triggered:
    triggers: tuple[str, ...]
    tags: tuple[Tag, ...]
    stop_after_first: bool = False


Node = Lit | Regex | Json | Seq | Alt | Opt | Repeat | Triggered


def seq(*items: Node | None) -> Node:
    """A sequence without empty parts, flattened; one item stands for itself."""
    flat: list[Node] = []
    for item in items:
        if item is None or (isinstance(item, Lit) and not item.text):
            continue
        if isinstance(item, Seq):
            flat.extend(item.items)
        elif isinstance(item, Lit) and flat and isinstance(flat[-1], Lit):
            flat[-1] = Lit(flat[-1].text + item.text)
        else:
            flat.append(item)
    if not flat:
        return Lit("")
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


def alt(*items: Node) -> Node:
    """A choice; one item stands for itself."""
    unique = tuple(dict.fromkeys(items))
    return unique[0] if len(unique) == 1 else Alt(unique)


def repeat(item: Node, sep: str = "", min_items: int = 1, max_items: int | None = None) -> Node:
    """`item (sep item)*` between min_items and max_items times (min_items may be 0)."""
    if max_items == 1:
        return Opt(item) if min_items == 0 else item
    if min_items == 0:
        return Opt(Repeat(item, sep, 1, max_items))
    return Repeat(item, sep, min_items, max_items)
