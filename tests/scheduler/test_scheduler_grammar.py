"""Grammar handling in the scheduler against the fake runner: jump-forward's KV
bookkeeping (rolled-back tokens free their slots, forced tokens are extended
in the next step), requests waiting for a compilation, abort and failures."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import pytest
from test_scheduler import FakeTokenizer, make_scheduler, run_all, submit

from radixlm.constrained.base_grammar_backend import GrammarError
from radixlm.constrained.grammar_cache import PollResult
from radixlm.messages.io_struct import AbortReq
from radixlm.scheduler.grammar_manager import GrammarManager
from radixlm.scheduler.scheduler import Scheduler
from radixlm.server_args import ServerArgs

FORCED = "bcd"  # never "a": FakeTokenizer.encode("a") is the EOS id


class LetterTokenizer(FakeTokenizer):
    """Token i decodes to letter i % 26; text encodes to ids 0..25, so a retokenized
    tail usually differs from the sampled ids and gets rolled back."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) - ord("a") for c in text]


class ForcingGrammar:
    """Accepts every token; every 3 accepted tokens it forces FORCED."""

    def __init__(self) -> None:
        self.accepted: list[int] = []

    def accept_token(self, token_id: int) -> None:
        self.accepted.append(token_id)

    def rollback(self, num_tokens: int) -> None:
        del self.accepted[len(self.accepted) - num_tokens :]

    def is_terminated(self) -> bool:
        return False

    def fill_vocab_mask(self, mask: Any, row: int) -> None:
        pass  # every token allowed (the scheduler fills masks, the runner applies them)

    def try_jump_forward(self) -> str | None:
        return FORCED if len(self.accepted) % 3 == 0 else None

    def copy(self) -> ForcingGrammar:
        return ForcingGrammar()


def _with_grammar(s: Scheduler, rid: str, prompt: list[int], **params: Any) -> ForcingGrammar:
    submit(s, rid, prompt, **params)
    req = s.waiting[-1]
    grammar = ForcingGrammar()
    req.grammar = grammar  # type: ignore[assignment]
    return grammar


@pytest.mark.parametrize("config", [
    {},
    {"chunked_prefill_size": 2},
    {"disable_radix_cache": True},
])
def test_jump_forward_keeps_kv_consistent(config: dict) -> None:
    s = make_scheduler(**config)
    s.output.tokenizer = s.jump_forward.tokenizer = LetterTokenizer()  # type: ignore[union-attr]
    grammars = [_with_grammar(s, f"r{i}", [5 + i, 6, 7, 8], max_new_tokens=30) for i in range(4)]
    submit(s, "plain", [9, 9, 9], max_new_tokens=30)
    results = run_all(s)  # check_integrity after every step
    for i, grammar in enumerate(grammars):
        out = results[f"r{i}"]
        assert len(out) == 30
        assert grammar.accepted == out  # the grammar saw exactly the final tokens
        text = LetterTokenizer().decode(out)
        assert FORCED in text
    reqs = {r.rid: r for r in s.output.pending_finished} or None
    assert reqs is None  # collected
    assert len(results["plain"]) == 30


def test_jump_forward_fewer_forward_steps_and_kv_freed() -> None:
    s = make_scheduler()
    s.output.tokenizer = s.jump_forward.tokenizer = LetterTokenizer()  # type: ignore[union-attr]
    _with_grammar(s, "g", [3, 4, 5], max_new_tokens=40)
    req = s.waiting[-1]
    run_all(s)
    assert req.num_jump_forward_tokens > 0
    assert req.num_forward_steps < len(req.output_ids)
    s.check_integrity()
    assert s.kv.stats()["num_used_tokens"] == 0


def test_jump_forward_respects_max_new_tokens() -> None:
    s = make_scheduler()
    s.output.tokenizer = s.jump_forward.tokenizer = LetterTokenizer()  # type: ignore[union-attr]
    _with_grammar(s, "g", [3, 4, 5], max_new_tokens=4)
    assert len(run_all(s)["g"]) == 4


class StubCache:
    def __init__(self, result: PollResult) -> None:
        self.result = result
        self.submitted: list[tuple[str, str]] = []

    def get_or_submit(self, kind: str, text: str) -> None:
        self.submitted.append((kind, text))

    def poll(self, key: tuple[str, str]) -> PollResult:
        return self.result


def _manager(cache: StubCache | None) -> GrammarManager:
    manager = GrammarManager(ServerArgs(), "unused", 97, {0})
    manager._cache_future = Future()  # "building": start() does nothing
    manager.build_started = time.monotonic()
    if cache is not None:
        manager._cache_future.set_result(cache)  # type: ignore[arg-type]
    return manager


def _scheduler_with(manager: GrammarManager) -> Scheduler:
    s = make_scheduler()
    s.grammars = manager
    return s


def test_request_waits_for_its_grammar_and_abort_reaches_it() -> None:
    s = _scheduler_with(_manager(None))
    submit(s, "g", [1, 2, 3], regex="(a|b)")
    submit(s, "plain", [1, 2], max_new_tokens=3)
    assert s.num_compiling == 1 and s.has_work
    outs = {o.rid: o for _ in range(10) for o in s.step()}
    assert "plain" in outs and "g" not in outs and s.num_compiling == 1
    s.abort(AbortReq("g"))
    outs = {o.rid: o for o in s.step()}
    assert outs["g"].finished_reason is not None
    assert outs["g"].finished_reason.type == "abort" and s.num_compiling == 0


def test_failed_grammar_is_a_400_and_others_run() -> None:
    error = GrammarError("Failed to compile regex grammar: unclosed group")
    s = _scheduler_with(_manager(StubCache(PollResult(True, error=error))))
    submit(s, "bad", [1, 2, 3], regex="(")
    submit(s, "plain", [1, 2], max_new_tokens=3)
    finished = {o.rid: o.finished_reason for _ in range(10) for o in s.step() if o.finished_reason}
    assert finished["bad"] is not None and finished["bad"].status_code == 400
    assert "Failed to compile regex grammar" in (finished["bad"].message or "")
    assert finished["plain"] is not None and finished["plain"].type == "length"


def test_grammars_disabled_rejects() -> None:
    s = make_scheduler()
    submit(s, "g", [1, 2, 3], regex="(a|b)")
    out = s.step()[0]
    assert out.finished_reason is not None and out.finished_reason.status_code == 400


class RejectingGrammar(ForcingGrammar):
    """Rejects its third token (a backend bug: the mask allowed it)."""

    def accept_token(self, token_id: int) -> None:
        if len(self.accepted) == 2:
            raise GrammarError(f"Token {token_id} is not allowed by the grammar")
        super().accept_token(token_id)

    def try_jump_forward(self) -> str | None:
        return None


def test_rejected_token_is_not_shown_and_request_aborts() -> None:
    s = make_scheduler()
    submit(s, "g", [3, 4, 5], max_new_tokens=10)
    s.waiting[-1].grammar = RejectingGrammar()  # type: ignore[assignment]
    tokens: list[int] = []
    reason = None
    for _ in range(20):
        for out in s.step():
            tokens.extend(out.new_token_ids)
            reason = out.finished_reason or reason
        if reason is not None:
            break
    assert reason is not None and reason.type == "abort" and reason.status_code == 500
    assert len(tokens) == 2
    s.check_integrity()
