"""Hypothesis strategies for request bodies, from the routes' own pydantic models.

`body_strategy(schema)` reads a model's JSON schema (the subset pydantic writes:
objects, arrays, scalars, anyOf/oneOf, $ref, enum/const, bounds) and draws
bodies with at most ONE anomaly each, so that every field's edge cases get
drawn often and what passes validation reaches the engine:
- a clean body (two in five): every value of its type and inside its bounds;
- else one field, at any depth, gets an edge: a bound, just past it, a huge or
  non-finite number, the wrong JSON type, or it goes missing; now and then an
  unknown field is added. Objects pick that field in proportion to the leaves
  under it, so /generate's 25 sampling parameters get their share.

`bound_cost` caps what an in-range body may ask the model to do (samples,
tokens), so that every case is quick; out-of-range values stay as drawn.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from hypothesis import strategies as st

from radixlm.messages.sampling_params import SamplingParams

CHARS = st.characters(codec="utf-8")  # no lone surrogates: JSON text must be UTF-8
JSON_SCALARS = (st.none() | st.booleans() | st.integers() | st.text(CHARS, max_size=12)
                | st.floats(allow_nan=False, allow_infinity=False))
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(CHARS, max_size=6),
                                                                inner, max_size=3),
    max_leaves=6)
EDGE_FLOATS = st.sampled_from([0.0, -0.0, 1e-300, 1e-45, 1e-7, 100.0, 101.0, -1.0, 1e38,
                               3.5e38, 1e308, -1e308, float("inf"), float("nan"), "inf", "1.5",
                               True, None])
EDGE_INTS = st.sampled_from([0, -1, 1, 2, 127, 128, 129, 2**31, 2**63 - 1, 2**63, 2**64 - 1,
                             2**64, -(2**63) - 1, 10**30, True, False, "2", 2.0, None])
TEXT = st.text(CHARS, max_size=40) | st.sampled_from([
    "", "USER: <image>\nHi\nASSISTANT:", "<video>", "<|endoftext|>", "a" * 600])
MEDIA = ["", "data:image/png;base64,AAAA", "iVBORw0KGgo=", "/etc/passwd",
         "file:///etc/hostname", "http://127.0.0.1:1/x.png", "HTTP://[::1]/", "x" * 64]
# Optional in the schema but needed in practice (a chat message's content): nearly always
# drawn; constraints rarely (two in one body are a 400 that hides everything else).
USUALLY_PRESENT = {"content", "text", "sampling_params", "max_new_tokens", "num_predict"}
RARELY_PRESENT = {"suffix", "best_of", "tool_calls", "regex", "ebnf", "json_schema",
                  "response_format", "structural_tag", "continue_final_message"}


class Field(NamedTuple):
    clean: st.SearchStrategy[Any]  # a valid value
    edge: st.SearchStrategy[Any]  # the same value with one anomaly
    size: int = 1  # the leaves below: a field's chance to hold a body's anomaly


def _native_sampling_schema() -> dict[str, Any]:
    """sampling_params of /generate as a schema (the model declares it a free dict)."""
    props: dict[str, Any] = {}
    for name, value in SamplingParams().__dict__.items():
        if isinstance(value, bool):
            props[name] = {"type": "boolean"}
        elif isinstance(value, int):
            props[name] = {"type": "integer", "minimum": 0, "maximum": 16}
        elif isinstance(value, float):
            props[name] = {"type": "number", "minimum": 0.0, "maximum": 1.0}
        else:
            props[name] = {"type": "string"}
    props["top_k"] = {"type": "integer", "minimum": -1, "maximum": 50}
    props["n"] = {"type": "integer", "minimum": 1, "maximum": 3}
    props["stop"] = {"anyOf": [{"type": "string"}, {"type": "array", "items": {
        "type": "string"}}]}
    props["stop_token_ids"] = {"type": "array", "items": {"type": "integer", "minimum": 0,
                                                          "maximum": 258}}
    props["logit_bias"] = {"type": "object", "additionalProperties": {
        "type": "number", "minimum": -100, "maximum": 100}}
    props["seed"] = {"type": "integer"}
    props["regex"] = {"enum": ["[a-z]+", "((", "(a|b)*c", ".{0,3}"]}
    props["json_schema"] = {"enum": ['{"type": "object"}', "{", '{"type": "integer"}']}
    props["ebnf"] = {"enum": ['root ::= "yes" | "no"', "root ::= ("]}
    return {"type": "object", "properties": props}


NATIVE_SAMPLING = _native_sampling_schema()


def sampling_params_strategy() -> st.SearchStrategy[Any]:
    """/generate's sampling_params, each with one anomaly: a route's bodies spread their
    one anomaly over every field, these spend it all on the sampling parameters."""
    return _Builder({}).build(NATIVE_SAMPLING, depth=0).edge


def body_strategy(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Bodies for a model's JSON schema (its `$defs` resolve its refs)."""
    field = _Builder(schema.get("$defs", {})).build(schema, depth=0)
    return st.integers(0, 4).flatmap(lambda k: field.clean if k < 2 else field.edge)


class _Builder:
    def __init__(self, defs: dict[str, Any]) -> None:
        self.defs = defs

    def build(self, schema: dict[str, Any], depth: int) -> Field:
        if depth > 6:
            return Field(JSON_SCALARS, JSON_SCALARS)
        if "$ref" in schema:
            return self.build(self.defs[schema["$ref"].rsplit("/", 1)[1]], depth + 1)
        if "const" in schema:
            return Field(st.just(schema["const"]), JSON_SCALARS)
        if "enum" in schema:
            return Field(st.sampled_from(schema["enum"]), JSON_SCALARS)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                # NOTE: an optional field's null is its absence, drawn elsewhere: an edge here.
                kinds = [s for s in schema[key] if s.get("type") != "null"] or schema[key]
                options = [self.build(s, depth + 1) for s in kinds]
                nulls = [st.none()] if len(kinds) < len(schema[key]) else []
                # The first kind is the main one (a dict of sampling_params, not a batch).
                rest = [o.edge for o in options[1:]] + nulls
                edge = _mostly(options[0].edge, st.one_of(rest)) if rest else options[0].edge
                return Field(st.one_of([o.clean for o in options]), edge,
                             max(o.size for o in options))
        kind = schema.get("type")
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        if kind == "integer":
            return self._integer(schema)
        if kind == "number":
            low, high = _bounds(schema, -1e6, 1e6)
            clean = st.floats(low, high, allow_nan=False,
                              exclude_min="exclusiveMinimum" in schema,
                              exclude_max="exclusiveMaximum" in schema)
            return Field(clean, EDGE_FLOATS | st.sampled_from([low, high]))
        if kind == "boolean":
            return Field(st.booleans(), st.sampled_from(["yes", "true", 1, 0, None, []]))
        if kind == "string":
            return Field(TEXT, JSON_SCALARS | st.just("\x00" * 8))
        if kind == "null":
            return Field(st.none(), JSON_SCALARS)
        return Field(JSON_VALUES, JSON_VALUES)  # no type (Any): anything

    def _integer(self, schema: dict[str, Any]) -> Field:
        if "minimum" not in schema and "maximum" not in schema:  # e.g. a seed: any integer
            huge = st.sampled_from([2**63, 2**64 - 1, 2**64, -(2**63) - 1, 10**30])
            return Field(st.integers(-1000, 1000), huge | st.integers() | EDGE_INTS)
        low, high = _bounds(schema, -1000, 1000)
        low, high = math.ceil(low), math.floor(high)
        return Field(st.integers(low, high),
                     st.sampled_from([low - 1, high + 1]) | st.integers() | EDGE_INTS)

    def _array(self, schema: dict[str, Any], depth: int) -> Field:
        item = self.build(schema.get("items", {}), depth + 1)
        low = schema.get("minItems", 0)
        high = max(low, 3)
        clean = st.lists(item.clean, min_size=low, max_size=high)
        with_edge = st.tuples(st.lists(item.clean, min_size=max(low - 1, 0), max_size=high - 1),
                              item.edge, st.integers(0, high)).map(
            lambda t: t[0][: t[2]] + [t[1]] + t[0][t[2]:])
        short = st.lists(item.clean, max_size=max(low - 1, 0))
        return Field(clean, with_edge | short | JSON_SCALARS, item.size)

    def _object(self, schema: dict[str, Any], depth: int) -> Field:
        props: dict[str, Any] = dict(schema.get("properties", {}))
        if "sampling_params" in props:  # /generate's free dict: give it its real fields
            props["sampling_params"] = {"anyOf": [NATIVE_SAMPLING, {
                "type": "array", "items": NATIVE_SAMPLING, "minItems": 1, "maxItems": 2}]}
        for name in ("image_data", "video_data", "url", "data"):
            if name in props:  # media sources: also the forms the loader tells apart
                props[name] = {"anyOf": [props[name], {"enum": MEDIA}]}
        if "images" in props:  # Ollama's images: a list of sources
            props["images"] = {"anyOf": [props["images"], {"type": "array", "items": {
                "enum": MEDIA}, "maxItems": 2}]}
        extra = schema.get("additionalProperties")
        if not props:
            value = self.build(extra, depth + 1) if isinstance(extra, dict) else Field(
                JSON_VALUES, JSON_VALUES)
            keys = st.integers(0, 258).map(str)  # token ids, for logit_bias
            return Field(st.dictionaries(keys, value.clean, max_size=3),
                         st.dictionaries(keys | st.text(CHARS, max_size=6), value.edge,
                                         min_size=1, max_size=2) | JSON_SCALARS, 2)
        required = set(schema.get("required", []))
        fields = {name: self.build(s, depth + 1) for name, s in props.items()}

        names = list(fields)
        weighted = [n for n in names for _ in range(fields[n].size)]

        @st.composite
        def draw(draw_: Any, anomaly: bool) -> Any:
            target = draw_(st.sampled_from(weighted)) if anomaly else None
            present = [n for n in names if n in required or n == target or draw_(_present(n))]
            how = draw_(st.sampled_from(["edge", "edge", "edge", "missing", "unknown"]))
            out: dict[str, Any] = {}
            for name in present:
                if name != target:
                    out[name] = draw_(fields[name].clean)
                elif how != "missing":
                    out[name] = draw_(fields[name].edge if how == "edge" else fields[name].clean)
            if target is not None and how == "unknown":
                out[draw_(st.text(CHARS, min_size=1, max_size=8))] = draw_(JSON_VALUES)
            return out

        return Field(draw(False), _mostly(draw(True), JSON_SCALARS),
                     sum(f.size for f in fields.values()))


def _present(name: str) -> st.SearchStrategy[bool]:
    """Whether to draw an optional field: one time in three (see USUALLY_PRESENT)."""
    chance = 19 if name in USUALLY_PRESENT else 1 if name in RARELY_PRESENT else 6
    return st.integers(0, 19).map(lambda k: k < chance)


def _mostly(usual: st.SearchStrategy[Any], rare: st.SearchStrategy[Any]
            ) -> st.SearchStrategy[Any]:
    """`usual` seven times in eight, else `rare`."""
    return st.integers(0, 7).flatmap(lambda k: rare if k == 0 else usual)


def _bounds(schema: dict[str, Any], low: float, high: float) -> tuple[float, float]:
    low = schema.get("minimum", schema.get("exclusiveMinimum", low))
    high = schema.get("maximum", schema.get("exclusiveMaximum", high))
    return float(low), float(high)


def bound_cost(body: Any, max_tokens: int = 8, max_n: int = 3) -> Any:
    """`body` with in-range sample counts and token budgets capped (a copy)."""
    if isinstance(body, list):
        return [bound_cost(b, max_tokens, max_n) for b in body]
    if not isinstance(body, dict):
        return body
    out = {k: bound_cost(v, max_tokens, max_n) for k, v in body.items()}
    for key in ("max_tokens", "max_completion_tokens", "max_new_tokens", "min_tokens",
                "min_new_tokens", "num_predict"):
        if _is_int(out.get(key)) and out[key] > max_tokens:
            out[key] = max_tokens
    if _is_int(out.get("n")) and 1 < out["n"] <= 128:
        out["n"] = min(out["n"], max_n)
    if _is_int(out.get("best_of")) and out["best_of"] > 1:
        out["best_of"] = out.get("n", 1)
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
