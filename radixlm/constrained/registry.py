"""The grammar backends by name: `--grammar-backend` → a BaseGrammarBackend.

Each backend's module (and its library) is imported only when it is chosen: the
registry names them, the base class knows none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from radixlm.constrained.base_grammar_backend import BaseGrammarBackend


def _xgrammar() -> type[BaseGrammarBackend]:
    from radixlm.constrained.xgrammar_backend import XGrammarBackend

    return XGrammarBackend


def _outlines() -> type[BaseGrammarBackend]:
    from radixlm.constrained.outlines_backend import OutlinesBackend

    return OutlinesBackend


def _llguidance() -> type[BaseGrammarBackend]:
    from radixlm.constrained.llguidance_backend import LLGuidanceBackend

    return LLGuidanceBackend


GRAMMAR_BACKENDS: dict[str, Callable[[], type[BaseGrammarBackend]]] = {
    "xgrammar": _xgrammar,
    "outlines": _outlines,
    "llguidance": _llguidance,
}


def create_grammar_backend(
    name: str,
    tokenizer: Any,
    vocab_size: int,
    eos_token_ids: Sequence[int],
    **options: Any,
) -> BaseGrammarBackend:
    """Build the named backend ("xgrammar" | "outlines" | "llguidance").

    options: json_whitespace_pattern, json_disable_any_whitespace, json_bounded_numbers
    (see BaseGrammarBackend).
    """
    if name not in GRAMMAR_BACKENDS:
        raise ValueError(
            f"Unknown grammar backend {name!r}; expected one of {list(GRAMMAR_BACKENDS)}"
        )
    return GRAMMAR_BACKENDS[name]()(tokenizer, vocab_size, eos_token_ids, **options)
