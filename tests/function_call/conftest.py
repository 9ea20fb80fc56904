"""Session fixtures: the default model's tokenizer and one grammar backend of each kind."""

from __future__ import annotations

from typing import Any

import pytest

from radixlm.constrained import BaseGrammarBackend, create_grammar_backend

BACKEND_NAMES = ["xgrammar", "llguidance", "outlines"]


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    import transformers

    from radixlm.model_loader.model_path import resolve_model_dir

    return transformers.AutoTokenizer.from_pretrained(resolve_model_dir(None))


@pytest.fixture(scope="session")
def eos_token_ids(tokenizer: Any) -> list[int]:
    return [tokenizer.eos_token_id]


@pytest.fixture(scope="session")
def backends(tokenizer: Any, eos_token_ids: list[int]) -> dict[str, BaseGrammarBackend]:
    vocab_size = len(tokenizer) + 64  # padded past the tokenizer, as embeddings often are
    return {
        name: create_grammar_backend(name, tokenizer, vocab_size, eos_token_ids)
        for name in BACKEND_NAMES
    }
