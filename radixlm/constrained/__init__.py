"""Constrained decoding: grammar backends (xgrammar, outlines, llguidance), their registry
(registry.py) and their cache.

NOTE: the names below load their modules on first use (PEP 562), so importing a light
module of this package (json_bounds, from the HTTP process) does not import the
grammar libraries and torch, which take seconds.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixlm.constrained.base_grammar_backend import (
        GRAMMAR_KINDS,
        BaseGrammarBackend,
        BaseGrammarObject,
        GrammarError,
        allocate_vocab_mask,
        apply_vocab_mask,
        reset_vocab_mask,
    )
    from radixlm.constrained.grammar_cache import GrammarCache, PollResult
    from radixlm.constrained.registry import GRAMMAR_BACKENDS, create_grammar_backend

_HOMES = {
    "GRAMMAR_BACKENDS": "registry",
    "GRAMMAR_KINDS": "base_grammar_backend",
    "BaseGrammarBackend": "base_grammar_backend",
    "BaseGrammarObject": "base_grammar_backend",
    "GrammarError": "base_grammar_backend",
    "allocate_vocab_mask": "base_grammar_backend",
    "apply_vocab_mask": "base_grammar_backend",
    "create_grammar_backend": "registry",
    "reset_vocab_mask": "base_grammar_backend",
    "GrammarCache": "grammar_cache",
    "PollResult": "grammar_cache",
}

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


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
