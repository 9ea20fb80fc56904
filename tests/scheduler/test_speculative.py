"""Speculative decoding in the scheduler against a fake runner that samples every row.

The fake model copies the token `PERIOD` places back (so a prompt of `PERIOD`
tokens is repeated and n-gram drafts are right), except at chosen sequence
lengths where it "surprises" with another token (so a draft is rejected
there). Its next token is a pure function of the sequence, read back through
the request's KV slots, so a wrongly kept or wrongly freed slot changes the
output; every test compares with decoding one token at a time and checks KV
integrity after every step (run_all).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from test_scheduler import EOS, VOCAB, FakeRunner, FakeTokenizer, run_all, submit
from test_scheduler_grammar import ForcingGrammar, LetterTokenizer

from radixlm.constrained.base_grammar_backend import GrammarError
from radixlm.messages.forward_step import ForwardStep, StepResult
from radixlm.scheduler.scheduler import Scheduler
from radixlm.server_args import ServerArgs

PERIOD = 8
PROMPT = list(range(1, PERIOD + 1))
Model = Callable[[list[int]], int]


def copy_model(surprises: frozenset[int] = frozenset()) -> Model:
    """Next token: the one PERIOD back, plus one where len(seq) is a surprise."""
    def next_token(seq: list[int]) -> int:
        token = seq[-PERIOD] if len(seq) >= PERIOD else 1
        return token % (VOCAB - 1) + 1 if len(seq) in surprises else token
    return next_token


class RowsRunner(FakeRunner):
    """FakeRunner whose items sample their last num_sample_rows rows (a verify step)."""

    def __init__(self, num_tokens: int, disable_radix: bool, model: Model) -> None:
        super().__init__(num_tokens, disable_radix)
        self.model = model

    def forward(self, step: ForwardStep) -> StepResult:
        self.steps.append(step)
        slots = step.out_cache_loc.tolist()
        ids: list[int | None] = []
        offset = 0
        for item in step.items:
            for slot, token in zip(slots[offset : offset + item.extend_len], item.input_ids):
                self.kv_tokens[slot] = token
            offset += item.extend_len
            row = self.req_to_token_pool.req_to_token[item.req_pool_idx]
            end = item.prefix_len + item.extend_len
            seq = [self.kv_tokens[s] for s in row[:end].tolist()]
            for r in range(item.num_sample_rows):
                ids.append(self.model(seq[: end - item.num_sample_rows + r + 1]))
        n = len(ids)
        return StepResult(ids, [None] * n, [None] * n, [None] * len(step.items))


def make(model: Model, num_tokens: int = 4096, spec: bool = True, **kwargs: Any) -> Scheduler:
    if spec:  # 1-grams: the first draft comes right after the first sampled token
        kwargs = {"speculative_algorithm": "NGRAM",
                  "speculative_ngram_min_match_window_size": 1, **kwargs}
    args = ServerArgs(**kwargs)
    runner = RowsRunner(num_tokens, args.disable_radix_cache, model)
    return Scheduler(args, runner, FakeTokenizer())  # type: ignore[arg-type]


def verifies(s: Scheduler) -> list[tuple[int, int]]:
    """(drafted, accepted) of every verify, in order (recorded by wrapping the drafter)."""
    assert s.drafter is not None
    log: list[tuple[int, int]] = []
    on_verified = s.drafter.on_verified

    def record(req: Any, num_drafted: int, num_accepted: int) -> None:
        log.append((num_drafted, num_accepted))
        on_verified(req, num_drafted, num_accepted)

    s.drafter.on_verified = record  # type: ignore[method-assign]
    return log


def sequential(model: Model, prompt: list[int], n: int, stop: int | None = None) -> list[int]:
    seq = list(prompt)
    for _ in range(n):
        seq.append(model(seq))
        if seq[-1] == stop:
            break
    return seq[len(prompt):]


def test_full_acceptance() -> None:
    s = make(copy_model(), speculative_num_draft_tokens=4)
    log = verifies(s)
    submit(s, "a", PROMPT, max_new_tokens=41)
    assert run_all(s)["a"] == sequential(copy_model(), PROMPT, 41) == (PROMPT * 6)[:41]
    assert log and all(accepted == drafted for drafted, accepted in log)
    # A prefill, then 1 + 4 tokens per verify (the drafts and the model's own token).
    assert s.num_steps == 1 + 40 // 5
    assert s.drafter is not None and s.drafter.stats()["spec_accept_rate"] == 1.0


def test_rejection_at_first_token() -> None:
    model = copy_model(frozenset({PERIOD + 1}))  # the token after the first sampled one
    s = make(model, speculative_num_draft_tokens=4)
    log = verifies(s)
    submit(s, "a", PROMPT, max_new_tokens=20)
    assert run_all(s)["a"] == sequential(model, PROMPT, 20)
    assert log[0] == (4, 0)


def test_rejection_mid_draft() -> None:
    model = copy_model(frozenset({PERIOD + 3}))
    s = make(model, speculative_num_draft_tokens=4)
    log = verifies(s)
    submit(s, "a", PROMPT, max_new_tokens=20)
    assert run_all(s)["a"] == sequential(model, PROMPT, 20)
    assert log[0] == (4, 2)


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 7, 12])
def test_draft_never_crosses_max_new_tokens(max_new_tokens: int) -> None:
    s = make(copy_model(), speculative_num_draft_tokens=8)
    submit(s, "a", PROMPT, max_new_tokens=max_new_tokens)
    assert run_all(s)["a"] == PROMPT[:max_new_tokens] if max_new_tokens <= PERIOD else True
    for step in s.runner.steps:
        for item in step.items:
            assert item.prefix_len + item.extend_len <= len(PROMPT) + max_new_tokens


def test_stop_token_inside_a_draft() -> None:
    s = make(copy_model(), speculative_num_draft_tokens=6)
    log = verifies(s)
    submit(s, "a", PROMPT, max_new_tokens=30, stop_token_ids=[4])
    submit(s, "b", PROMPT[1:] + [EOS], max_new_tokens=30)  # EOS inside the draft
    results = run_all(s)
    assert results["a"] == [1, 2, 3, 4]  # drafted [2, 3, 4, 5, 6, 7]: the stop ends it
    assert results["b"] == sequential(copy_model(), PROMPT[1:] + [EOS], 30, stop=EOS)
    assert results["b"][-1] == EOS
    assert log[0][1] == 3


def test_stop_string_inside_a_draft() -> None:
    s = make(copy_model(), speculative_num_draft_tokens=6)
    submit(s, "a", PROMPT, max_new_tokens=30, stop=["def"])  # tokens 3, 4, 5
    assert run_all(s)["a"] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("config", [
    {},
    {"disable_radix_cache": True},
    {"chunked_prefill_size": 5},
    {"max_prefill_tokens": 3, "chunked_prefill_size": 3},  # drafts share a tiny budget
])
def test_batches_match_sequential(config: dict) -> None:
    model = copy_model(frozenset({11, 17, 18, 30, 33}))
    s = make(model, speculative_num_draft_tokens=5, speculative_disable_by_batch_size=8,
             **config)
    prompts = [PROMPT[i:] + PROMPT[:i] + PROMPT[: i + 2] for i in range(6)]
    for i, p in enumerate(prompts):
        submit(s, f"r{i}", p, max_new_tokens=25)
    results = run_all(s)
    for i, p in enumerate(prompts):
        assert results[f"r{i}"] == sequential(model, p, 25)
    assert s.drafter is not None and s.drafter.num_verify_steps > 0
    for step in s.runner.steps:
        assert step.num_tokens <= s.args.max_prefill_tokens


def test_retraction_keeps_outputs() -> None:
    model = copy_model(frozenset({20, 21}))
    s = make(model, num_tokens=150, schedule_conservativeness=0.0, speculative_num_draft_tokens=6)
    prompts = [PROMPT[i:] + PROMPT[:i] for i in range(6)]
    for i, p in enumerate(prompts):
        submit(s, f"r{i}", p, max_new_tokens=40)
    results = run_all(s)
    assert s.num_retractions > 0
    for i, p in enumerate(prompts):
        assert results[f"r{i}"] == sequential(model, p, 40)


def test_no_drafts_for_sampled_penalized_or_large_batches() -> None:
    s = make(copy_model(), speculative_disable_by_batch_size=2)
    submit(s, "hot", PROMPT, max_new_tokens=10, temperature=0.7)
    submit(s, "pen", PROMPT, max_new_tokens=10, frequency_penalty=0.5)
    submit(s, "min", PROMPT, max_new_tokens=10, min_new_tokens=6)
    run_all(s)
    assert s.drafter is not None
    for step in s.runner.steps:
        for item in step.items:
            if item.rid != "min" or item.sampling is None:
                assert item.num_sample_rows <= 1
            else:  # drafts once min_new_tokens is reached, when the batch is small again
                assert item.num_sample_rows == 1 or item.sampling.num_output_tokens >= 6
    s = make(copy_model(), speculative_disable_by_batch_size=2)
    for i in range(3):
        submit(s, f"r{i}", PROMPT, max_new_tokens=10)
    run_all(s)
    assert all(step.num_sample_rows <= 3 for step in s.runner.steps)


def test_low_acceptance_pauses_drafting() -> None:
    def noise(seq: list[int]) -> int:  # a pseudo-random function of the sequence
        return random.Random(str(seq)).randrange(1, VOCAB)
    s = make(noise, speculative_num_draft_tokens=4)
    prompt = [3, 4] * 40  # the n-grams find drafts
    submit(s, "a", prompt, max_new_tokens=200)
    assert run_all(s)["a"] == sequential(noise, prompt, 200)
    assert s.drafter is not None
    assert 0 < s.drafter.num_verify_steps < 20  # paused for 16, 32, 64, ... tokens


class BanningGrammar(ForcingGrammar):
    """Rejects token 13; forces nothing."""

    def accept_token(self, token_id: int) -> None:
        if token_id == 13:
            raise GrammarError("13 is not allowed")
        super().accept_token(token_id)

    def try_jump_forward(self) -> str | None:
        return None


def test_grammar_cuts_drafts_it_rejects() -> None:
    prompt = [10, 11, 12, 13, 14, 15, 16, 17]

    def no13(seq: list[int]) -> int:
        token = copy_model()(seq)
        return 20 if token == 13 else token
    s = make(no13, speculative_num_draft_tokens=6)
    submit(s, "a", prompt, max_new_tokens=30)
    grammar = BanningGrammar()
    s.waiting[-1].grammar = grammar  # type: ignore[assignment]
    out = run_all(s)["a"]
    assert out == sequential(no13, prompt, 30) and grammar.accepted == out
    drafted = [item.input_ids[1:] for step in s.runner.steps for item in step.items
               if item.num_sample_rows > 1]
    assert drafted and all(13 not in d for d in drafted)


@pytest.mark.parametrize("config", [{}, {"disable_radix_cache": True}])
def test_jump_forward_with_drafts_matches_decoding(config: dict) -> None:
    outs = []
    for spec in (False, True):
        s = make(copy_model(frozenset({13})), spec=spec, speculative_num_draft_tokens=4,
                 **config)
        s.output.tokenizer = s.jump_forward.tokenizer = LetterTokenizer()  # type: ignore[union-attr]
        grammars = []
        for i in range(3):
            submit(s, f"r{i}", PROMPT[i:] + PROMPT[:i], max_new_tokens=30)
            grammars.append(ForcingGrammar())
            s.waiting[-1].grammar = grammars[-1]  # type: ignore[assignment]
        results = run_all(s)
        outs.append(results)
        for i, grammar in enumerate(grammars):
            assert grammar.accepted == results[f"r{i}"]
    assert outs[0] == outs[1]
