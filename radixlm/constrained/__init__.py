"""Constrained decoding: grammar backends (xgrammar, outlines, llguidance) and their cache."""

from radixlm.constrained.base_grammar_backend import (
    GRAMMAR_BACKENDS,
    GRAMMAR_KINDS,
    BaseGrammarBackend,
    BaseGrammarObject,
    GrammarError,
    allocate_vocab_mask,
    apply_vocab_mask,
    create_grammar_backend,
    reset_vocab_mask,
)
from radixlm.constrained.grammar_cache import GrammarCache, PollResult

__all__ = [
    "GRAMMAR_BACKENDS",
    "GRAMMAR_KINDS",
    "BaseGrammarBackend",
    "BaseGrammarObject",
    "GrammarCache",
    "GrammarError",
    "PollResult",
    "allocate_vocab_mask",
    "apply_vocab_mask",
    "create_grammar_backend",
    "reset_vocab_mask",
]
