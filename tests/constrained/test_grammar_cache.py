"""GrammarCache: shared compilations, cached failures, timeouts, a loop that never waits."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from radixlm.constrained import (
    BaseGrammarBackend,
    BaseGrammarObject,
    GrammarCache,
    GrammarError,
)


class StubGrammar(BaseGrammarObject):
    def __init__(self, text: str) -> None:
        self.text = text

    def accept_token(self, token_id: int) -> None:
        pass

    def fill_vocab_mask(self, mask: torch.Tensor, row: int) -> None:
        pass

    def is_terminated(self) -> bool:
        return False

    def rollback(self, num_tokens: int) -> None:
        pass

    def try_jump_forward(self) -> str | None:
        return None

    def copy(self) -> StubGrammar:
        return StubGrammar(self.text)


class GatedBackend(BaseGrammarBackend):
    """Compiles only once `gate` is set; counts compilations; "bad" fails."""

    name = "stub"

    def __init__(self) -> None:
        super().__init__(None, 32, [0])
        self.gate = threading.Event()
        self.num_compiles = 0

    def _compile(self, kind: str, text: str) -> StubGrammar:
        self.num_compiles += 1
        self.gate.wait(5)
        if text == "bad":
            raise RuntimeError("syntax error at 0")
        return StubGrammar(text)


def wait_ready(cache: GrammarCache, key: tuple[str, str]) -> Any:
    for _ in range(500):
        result = cache.poll(key)
        if result.ready:
            return result
        time.sleep(0.01)
    raise AssertionError("never ready")


def test_two_callers_share_one_compilation() -> None:
    backend = GatedBackend()
    cache = GrammarCache(backend)
    first = cache.get_or_submit("regex", "a+")
    second = cache.get_or_submit("regex", "a+")
    assert first is second
    assert not cache.poll(("regex", "a+")).ready  # still compiling: poll does not wait
    backend.gate.set()
    one, two = wait_ready(cache, ("regex", "a+")), wait_ready(cache, ("regex", "a+"))
    assert backend.num_compiles == 1
    assert isinstance(one.grammar, StubGrammar) and one.grammar is not two.grammar
    cache.shutdown()


def test_failure_is_cached() -> None:
    backend = GatedBackend()
    backend.gate.set()
    cache = GrammarCache(backend)
    for _ in range(2):
        result = wait_ready(cache, ("regex", "bad"))
        assert result.grammar is None
        assert isinstance(result.error, GrammarError)
        assert str(result.error) == "Failed to compile regex grammar: syntax error at 0"
    assert backend.num_compiles == 1
    cache.shutdown()


def test_timeout_reports_an_error() -> None:
    backend = GatedBackend()
    cache = GrammarCache(backend, compile_timeout_s=0.05)
    assert not cache.poll(("json_schema", "{}")).ready
    time.sleep(0.1)
    result = cache.poll(("json_schema", "{}"))
    assert result.ready and result.error is not None
    assert "timed out" in str(result.error)
    assert cache.poll(("json_schema", "{}")).error is not None  # cached as failed
    backend.gate.set()
    cache.shutdown()


def test_real_backend_through_cache(backends: dict[str, BaseGrammarBackend]) -> None:
    for backend in backends.values():
        cache = GrammarCache(backend)
        result = wait_ready(cache, ("regex", r"\d{3}"))
        assert result.grammar is not None and result.error is None
        bad = wait_ready(cache, ("regex", "(ab"))
        assert bad.error is not None and "Failed to compile regex grammar" in str(bad.error)
        cache.shutdown()


def test_unsupported_kind_through_cache(backends: dict[str, BaseGrammarBackend]) -> None:
    cache = GrammarCache(backends["outlines"])
    result = wait_ready(cache, ("ebnf", 'root ::= "a"'))
    assert result.error is not None and "does not support ebnf" in str(result.error)
    cache.shutdown()


@pytest.mark.parametrize("kind", ["sql"])
def test_unknown_kind(kind: str) -> None:
    backend = GatedBackend()
    with pytest.raises(GrammarError, match="Unknown grammar kind"):
        backend.compile(kind, "x")
