"""Session fixtures: one tokenizer and one backend of each kind (tokenizer info takes ~1 s)."""

from __future__ import annotations

from typing import Any

import pytest

from radixlm.constrained import BaseGrammarBackend, create_grammar_backend

BACKEND_NAMES = ["xgrammar", "outlines", "llguidance"]


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    import transformers

    from radixlm.model_loader.model_path import resolve_model_dir

    return transformers.AutoTokenizer.from_pretrained(resolve_model_dir(None))


@pytest.fixture(scope="session")
def vocab_size(tokenizer: Any) -> int:
    # NOTE: padded past the tokenizer, as model embeddings often are.
    return len(tokenizer) + 64


@pytest.fixture(scope="session")
def eos_token_ids(tokenizer: Any) -> list[int]:
    return sorted({tokenizer.eos_token_id, 0})


@pytest.fixture(scope="session")
def backends(
    tokenizer: Any, vocab_size: int, eos_token_ids: list[int]
) -> dict[str, BaseGrammarBackend]:
    return {
        name: create_grammar_backend(name, tokenizer, vocab_size, eos_token_ids)
        for name in BACKEND_NAMES
    }


@pytest.fixture(params=BACKEND_NAMES)
def backend(
    request: pytest.FixtureRequest, backends: dict[str, BaseGrammarBackend]
) -> BaseGrammarBackend:
    return backends[request.param]
