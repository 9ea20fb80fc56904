"""`$ref` in a tool's parameters: moving a schema under another root, and resolving.

A pydantic model with a nested model writes its parameters as
`{"$defs": {"User": {...}}, "properties": {"user": {"$ref": "#/$defs/User"}}}`
(draft-04 tools write `definitions`); a `$ref` may also point anywhere else in
the schema (`#/properties/a`, `#` itself for recursion). Each tool keeps its
own definitions: tools never share them, even with the same names.

- `relocate(schema, pointer)`: the schema with every local `$ref` rewritten as
  if the schema sat at `pointer` of a larger document (`#/$defs/User` at
  `/$defs/get_user` becomes `#/$defs/get_user/$defs/User`), so a wrapper (the
  generic format's `{"tool_calls": [...]}`) can hold the tool's schema under
  its own `$defs` and every reference still resolves, on every backend.
- `resolve(root, ref)`: the subschema a local `$ref` names (JSON pointer).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

# Keywords whose values are data, not schemas: a "$ref" key inside them is not a reference.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


def has_local_ref(schema: Any) -> bool:
    """Whether a `$ref` to this document ("#...") occurs anywhere in `schema`."""
    if isinstance(schema, Mapping):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            return True
        return any(has_local_ref(v) for k, v in schema.items() if k not in _DATA_KEYWORDS)
    if isinstance(schema, list):
        return any(has_local_ref(v) for v in schema)
    return False


def escape_pointer_token(token: str) -> str:
    """A JSON-pointer reference token (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")


def relocate(schema: Any, pointer: str) -> Any:
    """A copy of `schema` whose local `$ref`s resolve when it is placed at `pointer`
    ("/$defs/name") of an enclosing document."""
    if isinstance(schema, Mapping):
        out: dict[str, Any] = {}
        for key, value in schema.items():
            if key == "$ref" and isinstance(value, str) and value.startswith("#"):
                out[key] = "#" + pointer + value[1:]
            elif key in _DATA_KEYWORDS:
                out[key] = value
            else:
                out[key] = relocate(value, pointer)
        return out
    if isinstance(schema, list):
        return [relocate(v, pointer) for v in schema]
    return schema


def resolve(root: Mapping[str, Any], ref: str) -> Any:
    """The subschema of `root` that the local reference `ref` ("#/$defs/User") names;
    KeyError if there is none."""
    if not ref.startswith("#"):
        raise KeyError(f"{ref!r} is not a reference into the same schema")
    path = unquote(ref[1:])
    node: Any = root
    if not path:
        return node
    if not path.startswith("/"):
        raise KeyError(f"{ref!r} is not a JSON pointer")
    for raw in path[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise KeyError(f"{ref!r} does not resolve")
    return node


class RecursionTooDeep(ValueError):
    """A recursive `$ref` that inlining would have to expand without end."""


# How many times one `$ref` may be expanded inside itself when inlining (a recursive
# model: a tree, a linked list); deeper alternatives are dropped where an anyOf / oneOf
# has others (a `null`, a leaf), else inlining fails.
MAX_RECURSION = 2


def inline_refs(schema: Any, root: Any = None, chain: tuple[str, ...] = ()) -> Any:
    """A copy of `schema` with every local `$ref` replaced by what it names (sibling
    keywords kept) and the definitions dropped: for grammars that have no named rules
    (the pythonic format). Raises KeyError for a reference that does not resolve and
    RecursionTooDeep (see MAX_RECURSION)."""
    root = schema if root is None else root
    if isinstance(schema, list):
        return [inline_refs(v, root, chain) for v in schema]
    if not isinstance(schema, Mapping):
        return schema
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        if chain.count(ref) >= MAX_RECURSION:
            raise RecursionTooDeep(f"the recursive reference {ref!r} nests too deep")
        target = inline_refs(resolve(root, ref), root, (*chain, ref))
        siblings = {k: v for k, v in schema.items() if k != "$ref"}
        merged = dict(target) if isinstance(target, Mapping) else {}
        merged.update(inline_refs(siblings, root, chain))
        return merged if isinstance(target, Mapping) or siblings else target
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("$defs", "definitions"):
            continue
        if key in _DATA_KEYWORDS:
            out[key] = value
        elif key in ("anyOf", "oneOf") and isinstance(value, list):
            kept = []
            for option in value:
                try:
                    kept.append(inline_refs(option, root, chain))
                except RecursionTooDeep:
                    continue
            if not kept:
                raise RecursionTooDeep(f"every branch of {key} recurses too deep")
            out[key] = kept
        else:
            out[key] = inline_refs(value, root, chain)
    return out
