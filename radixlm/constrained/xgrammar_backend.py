"""xgrammar backend: GrammarCompiler + GrammarMatcher, native bitmask and jump-forward."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import torch
import xgrammar as xgr

from radixlm.constrained.base_grammar_backend import (
    BaseGrammarBackend,
    BaseGrammarObject,
    GrammarError,
)
from radixlm.constrained.json_bounds import xgrammar_json_ebnf

logger = logging.getLogger(__name__)

# NOTE: by default JSON is written on one line with json.dumps' separators (", " and ": "):
# bounded (a model cannot pad an answer with newlines until max_tokens), the style models
# see most, and deterministic between values, so jump-forward can insert whole keys.
DEFAULT_JSON_SEPARATORS = (", ", ": ")


class XGrammarObject(BaseGrammarObject):
    def __init__(self, compiled: xgr.CompiledGrammar) -> None:
        self.compiled = compiled
        self.matcher = xgr.GrammarMatcher(compiled)  # rollback is unlimited

    def accept_token(self, token_id: int) -> None:
        if not self.matcher.accept_token(token_id):
            raise GrammarError(f"Token {token_id} is not allowed by the grammar")

    def fill_vocab_mask(self, mask: torch.Tensor, row: int) -> None:
        self.matcher.fill_next_token_bitmask(mask, row)

    def is_terminated(self) -> bool:
        return bool(self.matcher.is_terminated())

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0:
            self.matcher.rollback(num_tokens)

    def try_jump_forward(self) -> str | None:
        text = self.matcher.find_jump_forward_string()
        return text or None

    def copy(self) -> XGrammarObject:
        return XGrammarObject(self.compiled)


class XGrammarBackend(BaseGrammarBackend):
    name = "xgrammar"

    def __init__(
        self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int], **options: Any
    ):
        super().__init__(tokenizer, vocab_size, eos_token_ids, **options)
        if self.json_whitespace_pattern is not None:
            logger.warning("xgrammar ignores json_whitespace_pattern; JSON uses fixed separators")
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=self.eos_token_ids
        )
        self.compiler = xgr.GrammarCompiler(info, max_threads=8)

    def _compile(self, kind: str, text: str) -> XGrammarObject:
        if kind == "regex":
            compiled = self.compiler.compile_regex(text)
        elif kind == "json_schema":
            compiled = self._compile_json_schema(text)
        elif kind == "ebnf":
            compiled = self.compiler.compile_grammar(text)
        else:
            compiled = self._compile_structural_tag(text)
        return XGrammarObject(compiled)

    def _compile_json_schema(self, text: str) -> xgr.CompiledGrammar:
        separators = (",", ":") if self.json_disable_any_whitespace else DEFAULT_JSON_SEPARATORS
        if not self.json_bounded_numbers:
            return self.compiler.compile_json_schema(
                text, any_whitespace=False, separators=separators
            )
        # Numbers with bounded digits (json_bounds.py): xgrammar's EBNF, rewritten.
        return self.compiler.compile_grammar(xgrammar_json_ebnf(text, separators, bounded=True))

    def _compile_structural_tag(self, text: str) -> xgr.CompiledGrammar:
        spec = json.loads(text)
        if "structures" not in spec:  # xgrammar's own structural-tag format
            return self.compiler.compile_structural_tag(text)
        # SGLang's format: {"structures": [{"begin", "schema", "end"}], "triggers": [...]}
        tags = [
            xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"])
            for s in spec["structures"]
        ]
        return self.compiler.compile_structural_tag(tags, spec["triggers"])
