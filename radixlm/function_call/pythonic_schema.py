"""JSON schemas as grammars of Python literals, for the pythonic tool-call format.

`f(a=1, b="x", c=[True, None])`: the keyword arguments of a call, each value a
Python literal following the parameter's schema. What `ast.literal_eval` reads
back, converted to JSON, validates against the schema.

Supported: type (one or a list), enum, const, properties / required (members
in the schema's order; optional ones may be left out), items / minItems /
maxItems, anyOf / oneOf, local `$ref` (inlined, recursion at most
schema_refs.MAX_RECURSION deep), and values without a type (any literal, nested
at most ANY_DEPTH deep). Annotations (description, title, default, examples,
format, ...) are ignored, as JSON-schema validation ignores them. Any other
keyword that constrains values (pattern, minimum, ...) cannot be expressed:
ToolConstraintError says which.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from radixlm.constrained.json_bounds import NUMBER_REGEX, int64_regex
from radixlm.function_call.grammar_ir import Lit, Node, Opt, Regex, alt, repeat, seq
from radixlm.function_call.schema_refs import RecursionTooDeep, inline_refs
from radixlm.function_call.types import ToolConstraintError

ANY_DEPTH = 2
PY_STRING = '"(?:[^"\\\\\\n\\r]|\\\\["\\\\nrt\']|\\\\u[0-9a-fA-F]{4})*"'
# Numbers with bounded digits, as in every JSON-schema grammar (constrained/json_bounds.py).
PY_INTEGER = int64_regex()
PY_NUMBER = NUMBER_REGEX
PY_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_ANNOTATIONS = {
    "title", "description", "default", "examples", "format", "$schema", "$id", "$comment",
    "deprecated", "readOnly", "writeOnly", "additionalProperties", "strict",
}
_HANDLED = {"type", "enum", "const", "properties", "required", "items", "minItems", "maxItems",
            "anyOf", "oneOf"}


def py_literal(value: Any) -> str:
    """The Python literal of a JSON value (the form the grammar writes it in)."""
    if value is True:
        return "True"
    if value is False:
        return "False"
    if value is None:
        return "None"
    if isinstance(value, str | int | float):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(py_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        items = (f"{json.dumps(str(k), ensure_ascii=False)}: {py_literal(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    raise TypeError(f"not a JSON value: {value!r}")


def kwargs_grammar(schema: Mapping[str, Any], where: str) -> Node:
    """The keyword arguments (between the parentheses) for a tool's parameters schema."""
    try:
        schema = inline_refs(schema)
    except (KeyError, RecursionTooDeep) as e:
        raise ToolConstraintError(f"The pythonic tool-call grammar cannot follow $ref in "
                                  f"{where}: {e.args[0]}") from None
    _check_keywords(schema, where)
    properties = schema.get("properties")
    if properties is None and schema.get("additionalProperties") is False:
        properties = {}
    if properties is None:
        pair = seq(Regex(PY_IDENTIFIER), Lit("="), _extra_value(schema, where))
        return repeat(pair, ", ", min_items=0)
    required = _required(schema, properties, where)
    members = [
        (seq(Lit(f"{name}="), value_grammar(sub, f"{where}.{name}")), name in required)
        for name, sub in properties.items()
    ]
    return _members(members) or Lit("")


def value_grammar(schema: Any, where: str) -> Node:
    """A Python literal following `schema`."""
    if schema is True or schema == {}:
        return any_value(ANY_DEPTH)
    if not isinstance(schema, Mapping):
        raise ToolConstraintError(f"{where}: a schema must be an object")
    _check_keywords(schema, where)
    if "const" in schema:
        return Lit(py_literal(schema["const"]))
    if "enum" in schema:
        return alt(*(Lit(py_literal(v)) for v in schema["enum"]))
    for key in ("anyOf", "oneOf"):
        if key in schema:
            rest = {k: v for k, v in schema.items() if k != key}
            return alt(*(value_grammar({**rest, **sub}, where) for sub in schema[key]))
    schema_type = schema.get("type")
    if isinstance(schema_type, list):
        return alt(*(value_grammar({**schema, "type": t}, where) for t in schema_type))
    if schema_type is None:
        return any_value(ANY_DEPTH)
    return _typed(schema, schema_type, where)


def _typed(schema: Mapping[str, Any], schema_type: str, where: str) -> Node:
    if schema_type == "string":
        return Regex(PY_STRING)
    if schema_type == "integer":
        return Regex(PY_INTEGER)
    if schema_type == "number":
        return Regex(PY_NUMBER)
    if schema_type == "boolean":
        return alt(Lit("True"), Lit("False"))
    if schema_type == "null":
        return Lit("None")
    if schema_type == "array":
        item = value_grammar(schema.get("items", True), f"{where}[]")
        min_items = int(schema.get("minItems", 0))
        max_items = schema.get("maxItems")
        if max_items == 0:
            return Lit("[]")
        items = repeat(item, ", ", max(min_items, 1), max_items)
        return seq(Lit("["), Opt(items) if min_items == 0 else items, Lit("]"))
    if schema_type == "object":
        properties = schema.get("properties")
        if properties is None and schema.get("additionalProperties") is False:
            properties = {}
        if properties is None:
            pair = seq(Regex(PY_STRING), Lit(": "), _extra_value(schema, where))
            return seq(Lit("{"), repeat(pair, ", ", min_items=0), Lit("}"))
        required = _required(schema, properties, where)
        members = [
            (seq(Lit(json.dumps(name, ensure_ascii=False) + ": "), value_grammar(sub, f"{where}.{name}")),
             name in required)
            for name, sub in properties.items()
        ]
        return seq(Lit("{"), _members(members), Lit("}"))
    raise ToolConstraintError(f"{where}: unknown type {schema_type!r}")


def _required(schema: Mapping[str, Any], properties: Mapping[str, Any], where: str) -> set[str]:
    required = set(schema.get("required", []))
    missing = sorted(required - set(properties))
    if missing:
        raise ToolConstraintError(
            f"The pythonic tool-call grammar cannot express required {missing[0]!r} "
            f"without a schema in properties (in {where})"
        )
    return required


def _extra_value(schema: Mapping[str, Any], where: str) -> Node:
    """The value of a member not in `properties` (additionalProperties, else any)."""
    extra = schema.get("additionalProperties", True)
    return value_grammar(extra, f"{where}.*") if isinstance(extra, Mapping) else any_value(ANY_DEPTH - 1)


def _members(members: list[tuple[Node, bool]]) -> Node | None:
    """Members in order joined by ", "; optional ones may be missing. None: nothing at all.

    Size O(n^2): before the first member present, each optional one branches."""

    def rest_after(i: int) -> list[Node]:
        return [seq(Lit(", "), m) if req else Opt(seq(Lit(", "), m)) for m, req in members[i:]]

    def first_from(i: int) -> Node | None:
        if i == len(members):
            return None
        member, req = members[i]
        with_member = seq(member, *rest_after(i + 1))
        if req:
            return with_member
        without = first_from(i + 1)
        return Opt(with_member) if without is None else alt(with_member, without)

    return first_from(0)


def any_value(depth: int) -> Node:
    """Any Python literal of JSON values, containers nested at most `depth` deep."""
    scalars: list[Node] = [Regex(PY_STRING), Regex(PY_NUMBER), Lit("True"), Lit("False"), Lit("None")]
    if depth <= 0:
        return alt(*scalars)
    inner = any_value(depth - 1)
    array = seq(Lit("["), repeat(inner, ", ", min_items=0), Lit("]"))
    return alt(*scalars, array, _any_dict(depth))


def _any_dict(depth: int) -> Node:
    inner = any_value(depth - 1)
    pair = seq(Regex(PY_STRING), Lit(": "), inner)
    return seq(Lit("{"), repeat(pair, ", ", min_items=0), Lit("}"))


def _check_keywords(schema: Mapping[str, Any], where: str) -> None:
    unsupported = sorted(k for k in schema if k not in _HANDLED and k not in _ANNOTATIONS)
    if unsupported:
        raise ToolConstraintError(
            f"The pythonic tool-call grammar cannot express {unsupported[0]!r} (in {where})"
        )
