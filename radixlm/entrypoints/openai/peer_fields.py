"""The peers' structured-output fields, translated to radixlm's one grammar parameter.

vLLM (chat and completions):
    structured_outputs {"json": schema}          → json_schema
    structured_outputs {"regex": str}            → regex
    structured_outputs {"choice": [str, ...]}    → regex: the exact strings, alternated
    structured_outputs {"grammar": str}          → ebnf (GBNF / EBNF)
    structured_outputs {"structural_tag": str}   → structural_tag
    structured_outputs {"json_object": true}     → json_schema {"type": "object"}
    guided_json / guided_regex / guided_choice / guided_grammar: the same, legacy names
    guided_whitespace_pattern / structured_outputs.whitespace_pattern: with a JSON
        schema, the schema becomes a regex (outlines-core's schema-to-regex) with that
        whitespace between tokens (every backend compiles regexes)
llama.cpp:
    grammar (GBNF) → ebnf;  json_schema → json_schema (also SGLang's name, see grammar.py)

A field that asks for a constraint is never ignored: it becomes the grammar, or the
request is a 400 (two constraints, an empty choice, a whitespace pattern without a
JSON schema, options radixlm does not have).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ConfigDict, Field

from radixlm.entrypoints.http.strict import StrictModel
from radixlm.function_call.constraint import _regex_escape

JSON_OBJECT_SCHEMA = json.dumps({"type": "object"})


class StructuredOutputs(StrictModel):
    """vLLM's `structured_outputs` (its StructuredOutputsParams); unknown keys are a 400."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    json_: dict[str, Any] | str | None = Field(None, alias="json")  # NOTE: BaseModel.json
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | dict[str, Any] | None = None
    whitespace_pattern: str | None = None
    disable_any_whitespace: bool | None = None
    disable_fallback: bool | None = None
    disable_additional_properties: bool | None = None


def choice_regex(choices: list[str], where: str) -> str:
    """A regex matching exactly one of `choices` (escaped for every backend)."""
    if not choices:
        raise ValueError(f"{where} must list at least one string")
    return "(" + "|".join(_regex_escape(c) for c in choices) + ")"


def json_text(value: dict[str, Any] | str) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _with_whitespace(schema: str, pattern: str | None) -> tuple[str, str]:
    if pattern is None:
        return "json_schema", schema
    from outlines_core.json_schema import build_regex_from_schema

    try:
        return "regex", build_regex_from_schema(schema, whitespace_pattern=pattern)
    except Exception as e:  # outlines-core raises ValueError and its own errors
        raise ValueError(f"Cannot use this JSON schema with a whitespace pattern: {e}") from e


def peer_grammars(so: StructuredOutputs | None, guided: dict[str, Any],
                  llama_grammar: str | None) -> list[tuple[str, str]]:
    """(kind, text) of every constraint the peers' fields ask for (the caller refuses
    more than one). guided: the `guided_*` fields that were set."""
    found: list[tuple[str, str]] = []
    ws = guided.get("guided_whitespace_pattern")
    if so is not None:
        if so.disable_additional_properties or so.disable_any_whitespace:
            raise ValueError("structured_outputs.disable_additional_properties and "
                             "disable_any_whitespace are not supported per request (see "
                             "--constrained-json-disable-any-whitespace)")
        ws = so.whitespace_pattern if so.whitespace_pattern is not None else ws
        if so.json_ is not None:
            found.append(_with_whitespace(json_text(so.json_), ws))
        if so.regex is not None:
            found.append(("regex", so.regex))
        if so.choice is not None:
            found.append(("regex", choice_regex(so.choice, "structured_outputs.choice")))
        if so.grammar is not None:
            found.append(("ebnf", so.grammar))
        if so.json_object:
            found.append(("json_schema", JSON_OBJECT_SCHEMA))
        if so.structural_tag is not None:
            found.append(("structural_tag", json_text(so.structural_tag)))
    if guided.get("guided_json") is not None:
        found.append(_with_whitespace(json_text(guided["guided_json"]), ws))
    if guided.get("guided_regex") is not None:
        found.append(("regex", guided["guided_regex"]))
    if guided.get("guided_choice") is not None:
        found.append(("regex", choice_regex(guided["guided_choice"], "guided_choice")))
    if guided.get("guided_grammar") is not None:
        found.append(("ebnf", guided["guided_grammar"]))
    if llama_grammar is not None:
        found.append(("ebnf", llama_grammar))
    if ws is not None and not any(
            so_json is not None for so_json in (guided.get("guided_json"),
                                                so.json_ if so is not None else None)):
        raise ValueError("guided_whitespace_pattern needs a JSON schema (guided_json or "
                         "structured_outputs.json)")
    return found
