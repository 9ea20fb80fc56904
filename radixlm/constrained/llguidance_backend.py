"""llguidance backend: LLTokenizer (built once from the HF tokenizer) and LLMatcher.

Regexes, JSON schemas, EBNF (Lark or GBNF syntax) and structural tags are all
supported. JSON is written on one line with json.dumps' separators (", " and
": ") by default, compact with --constrained-json-disable-any-whitespace, or
with a given whitespace pattern; its numbers are bounded (json_bounds.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import llguidance
import llguidance.hf
import llguidance.torch
import torch

from radixlm.constrained.base_grammar_backend import (
    BaseGrammarBackend,
    BaseGrammarObject,
    GrammarError,
)
from radixlm.constrained.json_bounds import bound_schema


class LLGuidanceGrammarObject(BaseGrammarObject):
    def __init__(self, pristine: llguidance.LLMatcher, eos_token_ids: list[int]) -> None:
        # NOTE: `pristine` is never advanced; every copy deep-copies it (cheaper than
        # rebuilding the matcher from the grammar text).
        self.pristine = pristine
        self.matcher = pristine.deep_copy()
        self.eos_token_ids = eos_token_ids
        self.terminated = False
        self.eos_in_history = False  # whether llguidance recorded the accepted EOS

    def accept_token(self, token_id: int) -> None:
        if self.terminated:
            raise GrammarError(f"Token {token_id} after the grammar terminated")
        is_eos = token_id in self.eos_token_ids
        # NOTE: validate_tokens counts 0 for EOS once the matcher has stopped by itself
        # (nothing more can follow), though consuming it there is valid.
        allowed = (
            self.matcher.is_accepting() if is_eos else self.matcher.validate_tokens([token_id])
        )
        if not allowed:
            raise GrammarError(f"Token {token_id} is not allowed by the grammar")
        # NOTE: EOS consumed after the matcher stopped by itself is not in its history,
        # so `rollback` must not count it.
        self.eos_in_history = is_eos and not self.matcher.is_stopped()
        if not self.matcher.consume_token(token_id):
            raise GrammarError(f"Grammar error after token {token_id}: {self.matcher.get_error()}")
        self.terminated = is_eos

    def fill_vocab_mask(self, mask: torch.Tensor, row: int) -> None:
        llguidance.torch.fill_next_token_bitmask(self.matcher, mask, row)

    def is_terminated(self) -> bool:
        # NOTE: EOS accepted, as in the other backends; `is_stopped()` alone (nothing more
        # can follow) leaves EOS as the only allowed token, so EOS comes next anyway.
        return self.terminated

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0 and self.terminated:
            self.terminated = False
            num_tokens -= 0 if self.eos_in_history else 1
        if num_tokens > 0:
            self.matcher.rollback(num_tokens)

    def try_jump_forward(self) -> str | None:
        if self.matcher.is_stopped():
            return None
        forced = self.matcher.compute_ff_bytes()
        for cut in range(min(4, len(forced) + 1)):  # drop a partial UTF-8 character
            try:
                return forced[: len(forced) - cut].decode("utf-8") or None
            except UnicodeDecodeError:
                continue
        return None

    def copy(self) -> LLGuidanceGrammarObject:
        return LLGuidanceGrammarObject(self.pristine, self.eos_token_ids)


class LLGuidanceBackend(BaseGrammarBackend):
    name = "llguidance"

    def __init__(
        self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int], **options: Any
    ):
        super().__init__(tokenizer, vocab_size, eos_token_ids, **options)
        self.ll_tokenizer = llguidance.hf.from_tokenizer(
            tokenizer, n_vocab=vocab_size, eos_token=self.eos_token_ids
        )

    def json_options(self) -> dict[str, Any]:
        if self.json_disable_any_whitespace:
            return {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
        if self.json_whitespace_pattern is not None:
            return {"whitespace_pattern": self.json_whitespace_pattern}
        return {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

    def _grammar_text(self, kind: str, text: str) -> str:
        if kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(text)
        if kind == "json_schema":
            if self.json_bounded_numbers:
                text = json.dumps(bound_schema(json.loads(text), "llguidance"))
            return llguidance.LLMatcher.grammar_from_json_schema(
                text,
                defaults=self.json_options(),  # type: ignore[arg-type]
            )
        if kind == "ebnf":
            return llguidance.grammar_from("ebnf", text)
        return _structural_tag_grammar(text)

    def _compile(self, kind: str, text: str) -> LLGuidanceGrammarObject:
        grammar = self._grammar_text(kind, text)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, self.ll_tokenizer
        )
        if is_error:
            raise GrammarError(f"Failed to compile {kind} grammar: {messages[0]}")
        matcher = llguidance.LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"Failed to compile {kind} grammar: {matcher.get_error()}")
        return LLGuidanceGrammarObject(matcher, self.eos_token_ids)


def _structural_tag_grammar(text: str) -> str:
    """SGLang's {"structures": [{"begin", "schema", "end"}], "triggers": [...]} as llguidance tags."""
    spec = json.loads(text)
    if "structures" not in spec or "triggers" not in spec:
        raise GrammarError("Failed to compile structural_tag grammar: the llguidance backend "
                           "takes SGLang's structures/triggers form; xgrammar's format form "
                           "needs --grammar-backend xgrammar")
    tags = []
    for structure in spec["structures"]:
        triggers = [t for t in spec["triggers"] if structure["begin"].startswith(t)]
        if not triggers:
            raise GrammarError(
                f"Failed to compile structural_tag grammar: no trigger starts {structure['begin']!r}"
            )
        tags.append(
            llguidance.StructTag(
                trigger=triggers[0],
                begin=structure["begin"],
                grammar=structure["schema"],
                end=structure["end"],
            )
        )
    return llguidance.StructTag.to_grammar(tags, assume_special=False)
