"""Constrained decoding in the OpenAI requests: `response_format` and SGLang's extra
fields, translated to the runtime's one grammar sampling parameter.

    response_format {"type": "text"} or absent   → unconstrained
    response_format {"type": "json_object"}      → json_schema '{"type": "object"}'
    response_format {"type": "json_schema",      → json_schema json.dumps(schema)
        "json_schema": {"name", "schema", "strict"}}
    response_format {"type": "structural_tag",   → structural_tag json.dumps(
        "structures": [{"begin", "schema", "end"}], "triggers": [str]}
                                                      {"structures", "triggers"})
    response_format {"type": "structural_tag",   → structural_tag json.dumps(
        "format": {...}}  (xgrammar's newer form)     {"type": "structural_tag", "format"})
    regex, ebnf                                  → the same-named parameter
    json_schema (JSON text or an object)         → json_schema (an object is dumped)

A request carries at most one constraint: a non-text response_format together with
an extra field, or two extra fields, is a 400 with SamplingParams' own message.
`strict` is accepted and ignored: the grammar always enforces the whole schema.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from radixlm.entrypoints.http.strict import StrictModel
from radixlm.messages.sampling_params import TOO_MANY_GRAMMARS

JSON_OBJECT_SCHEMA = json.dumps({"type": "object"})  # any JSON object


class JsonSchemaFormat(StrictModel):
    """`response_format.json_schema`. NOTE: `schema` is held as `schema_` (pydantic's
    BaseModel has a `schema` method); both keys are accepted."""

    model_config = ConfigDict(populate_by_name=True)

    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class Structure(StrictModel):
    """One tag of a structural_tag format: text in `begin ... end` follows `schema`."""

    model_config = ConfigDict(populate_by_name=True)

    begin: str
    schema_: dict[str, Any] = Field(alias="schema")
    end: str


class ResponseFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    structures: list[Structure] | None = None
    triggers: list[str] | None = None
    # xgrammar's newer structural tag: {"type": "triggered_tags" | "tag" | ..., ...}
    format: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check(self) -> ResponseFormat:
        if self.type == "json_schema" and (self.json_schema is None
                                           or self.json_schema.schema_ is None):
            raise ValueError('type "json_schema" needs a "json_schema" object with a "schema" '
                             '(the JSON schema of the reply)')
        if self.type == "structural_tag":
            old_form = self.structures is not None or self.triggers is not None
            if self.format is not None and old_form:
                raise ValueError('type "structural_tag" takes either "format" or '
                                 '"structures" and "triggers", not both')
            if self.format is None and (self.structures is None or self.triggers is None):
                raise ValueError('type "structural_tag" needs a "format" object (xgrammar\'s '
                                 'structural tag) or "structures" and "triggers"')
        return self

    @property
    def grammar(self) -> tuple[str, str] | None:
        """(kind, text) for the runtime, or None for plain text."""
        if self.type == "json_object":
            return "json_schema", JSON_OBJECT_SCHEMA
        if self.type == "json_schema":
            assert self.json_schema is not None  # checked in _check
            return "json_schema", json.dumps(self.json_schema.schema_)
        if self.type == "structural_tag" and self.format is not None:
            return "structural_tag", json.dumps({"type": "structural_tag",
                                                 "format": self.format})
        if self.type == "structural_tag":
            assert self.structures is not None
            structures = [s.model_dump(by_alias=True) for s in self.structures]
            return "structural_tag", json.dumps({"structures": structures,
                                                 "triggers": self.triggers})
        return None


def request_grammar(response_format: ResponseFormat | None, regex: str | None,
                    ebnf: str | None, json_schema: str | dict[str, Any] | None
                    ) -> tuple[str, str] | None:
    """(kind, text) of a request's one constraint, or None; raise ValueError for two."""
    found: list[tuple[str, str] | None] = [response_format.grammar if response_format else None]
    if regex is not None:
        found.append(("regex", regex))
    if ebnf is not None:
        found.append(("ebnf", ebnf))
    if json_schema is not None:
        text = json_schema if isinstance(json_schema, str) else json.dumps(json_schema)
        found.append(("json_schema", text))
    constraints = [g for g in found if g is not None]
    if len(constraints) > 1:
        raise ValueError(TOO_MANY_GRAMMARS)
    return constraints[0] if constraints else None
