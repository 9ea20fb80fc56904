"""Bounded numbers in JSON-schema grammars, the way whitespace is bounded.

A JSON-schema `integer` or `number` without bounds lets a model write digits
until max_tokens (`"population": 3152222222…`): the output is cut and is not
JSON. By default (`--constrained-json-unbounded-numbers` turns it off) every
number a JSON-schema grammar allows has a bounded number of digits:

- integer: what a 64-bit integer holds, [-2**63, 2**63 - 1] (at most 19
  digits), unless the schema's own bounds say otherwise; a schema that bounds
  one side gets the other side from int64.
- number: at most 19 digits before the decimal point, MAX_FRACTION_DIGITS
  after it and MAX_EXPONENT_DIGITS in the exponent; a schema that bounds one
  side gets ±NUMBER_LIMIT on the other.

How each backend is told (they build JSON grammars themselves):
- xgrammar: its JSON-schema converter's EBNF, with the rules for unbounded
  integers and numbers (`basic_integer`, `basic_number`) replaced; a one-sided
  bound is completed in the schema (xgrammar then writes the range itself, at
  most 6 fraction digits and no exponent).
- outlines: outlines-core's regex, with its integer and number patterns
  replaced by ones of at most 19 digits before the point (outlines-core ignores
  minimum / maximum; an exact int64 pattern, repeated in every value of any
  type, makes its index many times slower to build).
- llguidance: its converter offers no such option, so the schema is completed:
  integers get their missing bounds (the lowest is -(2**63 - 1024): llguidance
  reads bounds as floats and fails at -2**63), numbers ±NUMBER_LIMIT and a
  `multipleOf` of 1e-10 (10 fraction digits, no exponent), and values of any
  type (`{}`, objects' extra properties, arrays without `items`) a bounded
  "any" definition.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
LLGUIDANCE_INT_MIN = -(2**63 - 1024)  # the closest to INT64_MIN its float bounds reach
NUMBER_LIMIT = 10**16
MAX_INTEGER_PART_DIGITS = 19  # an int64's digits
MAX_FRACTION_DIGITS = 10
MAX_EXPONENT_DIGITS = 3
LLGUIDANCE_MULTIPLE_OF = 1e-10  # 10 fraction digits; llguidance rejects smaller steps
ANY_DEF = "radixlm_any"

# Where subschemas sit: keyword -> how its value holds them.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_VALUES = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
                  "propertyNames", "unevaluatedProperties", "unevaluatedItems")
_LOWER, _UPPER = ("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")


# -- integer ranges as regular expressions -------------------------------------------------


def _up_to(limit: int) -> list[list[tuple[str, int, int]]]:
    """Alternatives for the positive integers 1..limit without leading zeros, each a list
    of (character class, fewest, most repeats)."""
    digits = str(limit)
    n = len(digits)
    alts: list[list[tuple[str, int, int]]] = []
    if n > 1:  # fewer digits than limit
        alts.append([("1-9", 1, 1)] + ([("0-9", 0, n - 2)] if n > 2 else []))
    for i, d in enumerate(digits):
        low, high = (1 if i == 0 else 0), int(d) - 1
        if high >= low:
            rest = [("0-9", n - i - 1, n - i - 1)] if n - i - 1 else []
            alts.append([(c, 1, 1) for c in digits[:i]] + [(f"{low}-{high}", 1, 1)] + rest)
    alts.append([(c, 1, 1) for c in digits])
    return alts


def _atom_regex(cls: str, fewest: int, most: int) -> str:
    atom = cls if len(cls) == 1 else f"[{cls}]"
    if (fewest, most) == (1, 1):
        return atom
    return f"{atom}{{{fewest},{most}}}" if fewest != most else f"{atom}{{{most}}}"


def _atom_ebnf(cls: str, fewest: int, most: int) -> str:
    atom = f'"{cls}"' if len(cls) == 1 else f"[{cls}]"
    return atom if (fewest, most) == (1, 1) else f"{atom}{{{fewest}, {most}}}"


def int64_regex() -> str:
    """A regex for exactly the integers in [INT64_MIN, INT64_MAX], JSON-written."""
    pos = "|".join("".join(_atom_regex(*a) for a in alt) for alt in _up_to(INT64_MAX))
    neg = "|".join("".join(_atom_regex(*a) for a in alt) for alt in _up_to(-INT64_MIN))
    return f"(?:0|(?:{pos})|-(?:{neg}))"


def int64_ebnf() -> str:
    """The same language as int64_regex, as an xgrammar EBNF expression."""
    pos = " | ".join(" ".join(_atom_ebnf(*a) for a in alt) for alt in _up_to(INT64_MAX))
    neg = " | ".join(" ".join(_atom_ebnf(*a) for a in alt) for alt in _up_to(-INT64_MIN))
    return f'("0" | ({pos}) | ("-" ({neg})))'


NUMBER_REGEX = (f"-?(?:0|[1-9][0-9]{{0,{MAX_INTEGER_PART_DIGITS - 1}}})"
                f"(?:\\.[0-9]{{1,{MAX_FRACTION_DIGITS}}})?"
                f"(?:[eE][+-]?[0-9]{{1,{MAX_EXPONENT_DIGITS}}})?")
NUMBER_EBNF = (f'("-"? ("0" | [1-9] [0-9]{{0, {MAX_INTEGER_PART_DIGITS - 1}}}) '
               f'("." [0-9]{{1, {MAX_FRACTION_DIGITS}}})? '
               f'([eE] [+\\-]? [0-9]{{1, {MAX_EXPONENT_DIGITS}}})?)')


# -- xgrammar and outlines: their grammar text ---------------------------------------------

_XGR_INTEGER = re.compile(r"^basic_integer ::= .*$", re.MULTILINE)
_XGR_NUMBER = re.compile(r"^basic_number ::= .*$", re.MULTILINE)


def bound_xgrammar_ebnf(ebnf: str) -> str:
    """xgrammar's JSON EBNF with its unbounded integer and number rules bounded."""
    ebnf = _XGR_INTEGER.sub(lambda _: f"basic_integer ::= {int64_ebnf()}", ebnf)
    return _XGR_NUMBER.sub(lambda _: f"basic_number ::= {NUMBER_EBNF}", ebnf)


# outlines-core's patterns for `number` and `integer` (its json_schema/types.rs).
_OUTLINES_NUMBER = r"((-)?(0|[1-9][0-9]*))(\.[0-9]+)?([eE][+-][0-9]+)?"
_OUTLINES_INTEGER = r"(-)?(0|[1-9][0-9]*)"


def bound_outlines_regex(regex: str) -> str:
    """outlines-core's regex for a schema with its integer and number patterns bounded.

    NOTE: both share the integer part's bound: in a value of any type they are
    alternatives, and different bounds there multiply the automaton's states."""
    integer = f"(-?(0|[1-9][0-9]{{0,{MAX_INTEGER_PART_DIGITS - 1}}}))"
    number = (f"({integer[1:-1]}(\\.[0-9]{{1,{MAX_FRACTION_DIGITS}}})?"
              f"([eE][+-][0-9]{{1,{MAX_EXPONENT_DIGITS}}})?)")
    regex = regex.replace(_OUTLINES_NUMBER, number)
    return regex.replace(_OUTLINES_INTEGER, integer)


# -- the schema: completing bounds ---------------------------------------------------------


def bound_schema(schema: Any, backend: str) -> Any:
    """A copy of `schema` whose numbers are bounded for `backend` (see the module doc);
    schemas that are not objects are returned as they are."""
    if not isinstance(schema, Mapping):
        return schema
    llguidance = backend == "llguidance"
    out = _walk(schema, llguidance)
    if llguidance and isinstance(out, dict):
        out = _with_any_def(out)
    return out


def _types(schema: Mapping[str, Any]) -> set[str]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    return {t for t in kind if isinstance(t, str)} if isinstance(kind, list) else set()


def _is_any(schema: Any) -> bool:
    """A schema that allows every value (only annotations, if anything)."""
    if schema is True:
        return True
    if not isinstance(schema, Mapping):
        return False
    annotations = {"title", "description", "default", "examples", "$comment", "deprecated"}
    return all(k in annotations for k in schema)


def _walk(schema: Any, llguidance: bool) -> Any:
    if llguidance and _is_any(schema):
        return {"$ref": f"#/$defs/{ANY_DEF}"}
    if not isinstance(schema, Mapping):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        value = out.get(key)
        if isinstance(value, Mapping):
            out[key] = {k: _walk(v, llguidance) for k, v in value.items()}
    for key in _SCHEMA_LISTS:
        value = out.get(key)
        if isinstance(value, list):
            out[key] = [_walk(v, llguidance) for v in value]
    for key in _SCHEMA_VALUES:
        if key in out:
            out[key] = _walk(out[key], llguidance)
    types = _types(out)
    if "integer" in types:
        _complete_range(out, LLGUIDANCE_INT_MIN if llguidance else INT64_MIN, INT64_MAX,
                        both=llguidance)
    elif "number" in types:
        _complete_range(out, -NUMBER_LIMIT, NUMBER_LIMIT, both=llguidance)
        if llguidance and "multipleOf" not in out:
            out["multipleOf"] = LLGUIDANCE_MULTIPLE_OF
    if llguidance:
        if "object" in types and "additionalProperties" not in out:
            out["additionalProperties"] = {"$ref": f"#/$defs/{ANY_DEF}"}
        if "array" in types and "items" not in out:
            out["items"] = {"$ref": f"#/$defs/{ANY_DEF}"}
    return out


def _complete_range(schema: dict[str, Any], low: int, high: int, both: bool) -> None:
    """Add the missing side of a range; with `both`, also when neither side is given."""
    has_low = any(k in schema for k in _LOWER)
    has_high = any(k in schema for k in _UPPER)
    if not (has_low or has_high) and not both:
        return  # the backend's own rule for unbounded numbers is bounded instead
    if not has_low:
        schema["minimum"] = low
    if not has_high:
        schema["maximum"] = high


def _with_any_def(schema: dict[str, Any]) -> dict[str, Any]:
    ref = {"$ref": f"#/$defs/{ANY_DEF}"}
    number = {"type": "number", "minimum": -NUMBER_LIMIT, "maximum": NUMBER_LIMIT,
              "multipleOf": LLGUIDANCE_MULTIPLE_OF}
    any_value = {"anyOf": [
        {"type": "null"}, {"type": "boolean"}, {"type": "string"}, number,
        {"type": "array", "items": ref}, {"type": "object", "additionalProperties": ref}]}
    defs = dict(schema.get("$defs") or {})
    defs[ANY_DEF] = any_value
    return {**schema, "$defs": defs}


def xgrammar_json_ebnf(schema_json: str, separators: tuple[str, str], bounded: bool) -> str:
    """xgrammar's EBNF for a JSON schema written on one line with `separators`, its
    numbers bounded unless `bounded` is False. Raises what xgrammar raises."""
    import json

    import xgrammar as xgr

    if bounded:
        schema_json = json.dumps(bound_schema(json.loads(schema_json), "xgrammar"))
    grammar = xgr.Grammar.from_json_schema(schema_json, any_whitespace=False,
                                           separators=separators)
    return bound_xgrammar_ebnf(str(grammar)) if bounded else str(grammar)
