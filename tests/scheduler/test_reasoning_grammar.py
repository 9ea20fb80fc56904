"""Grammars start after the think block: the scheduler with a scripted model.

The fake model "wants" to write a scripted text; each step it samples the scripted
token if the step's grammar mask allows it, else the lowest allowed token. Inside
the think block the mask must let the script through unchanged; after `</think>`
(one token, or split over several) the inner grammar (three digits) must rule.
"""

from __future__ import annotations

from typing import Any

import torch
from test_scheduler import EOS, FakeRunner, FakeTokenizer, run_all, submit

from radixlm.constrained.base_grammar_backend import GrammarError, mask_to_bool
from radixlm.constrained.reasoner_grammar import FreeGrammar, ReasonerGrammar, TokenTexts
from radixlm.messages.forward_step import ForwardStep, StepResult
from radixlm.scheduler.scheduler import Scheduler
from radixlm.server_args import ServerArgs

VOCAB = 97
TEXTS = [""] + [chr(ord("a") + i) for i in range(26)] + [str(d) for d in range(10)] + [
    "<think>", "</think>", "</", "think", ">", " ", "<"]
TEXTS += ["?"] * (VOCAB - len(TEXTS))
ID = {t: i for i, t in enumerate(TEXTS) if t != "?"}
DIGITS = [ID[str(d)] for d in range(10)]


def ids(*pieces: str) -> list[int]:
    return [ID[p] for p in pieces]


class DigitsGrammar:
    """Exactly three digits, then EOS."""

    def __init__(self) -> None:
        self.accepted: list[int] = []

    def _allowed(self) -> list[int]:
        return DIGITS if len(self.accepted) < 3 else [EOS]

    def accept_token(self, token_id: int) -> None:
        if token_id not in self._allowed():
            raise GrammarError(f"token {token_id} rejected")
        self.accepted.append(token_id)

    def fill_vocab_mask(self, mask: torch.Tensor, row: int) -> None:
        mask[row].fill_(0)
        for t in self._allowed():
            mask[row, t // 32] |= (1 << (t % 32)) if t % 32 < 31 else -(1 << 31)

    def is_terminated(self) -> bool:
        return bool(self.accepted) and self.accepted[-1] == EOS

    def rollback(self, num_tokens: int) -> None:
        del self.accepted[len(self.accepted) - num_tokens:]

    def try_jump_forward(self) -> str | None:
        return None

    def copy(self) -> DigitsGrammar:
        return DigitsGrammar()


class ScriptedRunner(FakeRunner):
    def __init__(self, script: list[int]) -> None:
        super().__init__(4096, False)
        self.script = script
        self.num_sampled = 0

    def forward(self, step: ForwardStep) -> StepResult:
        result = super().forward(step)
        wanted = self.script[self.num_sampled] if self.num_sampled < len(self.script) else EOS
        self.num_sampled += 1
        token = wanted
        if step.vocab_mask is not None and step.vocab_mask.rows:
            allowed = mask_to_bool(step.vocab_mask.bitmask[0], VOCAB)
            if not allowed[wanted]:
                token = int(allowed.nonzero()[0])
        result.next_token_ids[0] = token
        return result


def _run(script: list[int], phase: str, budget: int | None = None,
         inner: Any = None) -> tuple[list[int], Any]:
    s = Scheduler(ServerArgs(disable_jump_forward=True), ScriptedRunner(script),  # type: ignore[arg-type]
                  FakeTokenizer())  # type: ignore[arg-type]
    submit(s, "r", [5, 6, 7], max_new_tokens=40)
    inner = DigitsGrammar() if inner is None else inner
    s.waiting[-1].grammar = ReasonerGrammar(inner, TokenTexts(TEXTS), "<think>", "</think>",
                                            phase, budget)
    return run_all(s)["r"], inner


def test_free_inside_the_block_enforced_after_it() -> None:
    thought = ids("h", "m", "7", " ", "o", "k")
    answer = ids("n", "o", "p", "e")  # letters: the grammar must turn them into digits
    out, inner = _run(thought + ids("</think>") + answer, "inside")
    assert out[: len(thought) + 1] == thought + ids("</think>")  # untouched while thinking
    tail = out[len(thought) + 1:]
    assert tail == [DIGITS[0]] * 3 + [EOS]  # the lowest digits: the mask ruled
    assert inner.accepted == tail  # the grammar saw the answer only


def test_end_tag_split_over_tokens() -> None:
    thought = ids("a", "b") + ids("</", "think", ">")
    out, inner = _run(thought + ids("4", "2", "x", "y"), "inside")
    assert out == thought + ids("4", "2") + [DIGITS[0], EOS]
    assert inner.accepted == ids("4", "2") + [DIGITS[0], EOS]


def test_optional_block_opened() -> None:
    script = ids("<think>", "q", "</think>", "9", "9", "9")
    out, inner = _run(script, "start")
    assert out == script + [EOS]
    assert inner.accepted == ids("9", "9", "9", ) + [EOS]


def test_optional_block_skipped_grammar_from_the_start() -> None:
    out, inner = _run(ids("z", "z"), "start")  # neither a digit nor the start tag
    assert out == [DIGITS[0]] * 3 + [EOS]
    assert inner.accepted == out


def test_start_tag_split_then_rollback_replays() -> None:
    texts = TokenTexts(TEXTS)
    inner = DigitsGrammar()
    g = ReasonerGrammar(inner, texts, "<think>", "</think>", "start")
    mask = torch.full((1, 4), -1, dtype=torch.int32)
    g.fill_vocab_mask(mask, 0)
    allowed = mask_to_bool(mask[0], VOCAB)
    assert allowed[ID["<think>"]] and allowed[ID["<"]] and allowed[DIGITS[3]]
    assert not allowed[ID["a"]]
    for token in ids("<", "think", ">", "a", "</think>", "1"):
        g.accept_token(token)
    assert g.phase == "active" and inner.accepted == ids("1")
    g.rollback(6)
    assert g.phase == "start" and inner.accepted == []
    g.accept_token(ID["3"])
    assert g.phase == "active" and inner.accepted == ids("3")


def test_copy_starts_fresh() -> None:
    g = ReasonerGrammar(DigitsGrammar(), TokenTexts(TEXTS), "<think>", "</think>", "inside")
    g.accept_token(ID["</think>"])
    fresh: Any = g.copy()
    assert g.phase == "active" and fresh.phase == "reasoning"


# -- thinking_token_budget -----------------------------------------------------------------


def test_budget_forces_the_end_tag_then_the_answer_grammar() -> None:
    thought = ids("h", "m", "7", " ", "o", "k")
    out, inner = _run(thought + ids("</think>", "n", "o"), "inside", budget=2)
    assert out[:3] == ids("h", "m", "</think>")  # two thinking tokens, then the end forced
    assert out[3:] == [DIGITS[0]] * 3 + [EOS] and inner.accepted == out[3:]


def test_budget_continues_an_end_tag_already_begun() -> None:
    out, _ = _run(ids("a", "</", "x", "y"), "inside", budget=2)
    text = "".join(TEXTS[t] for t in out if t != EOS)
    assert text == "a</think>000"  # each token brings the tag closer (no stalling)


def test_budget_zero_answers_at_once() -> None:
    out, _ = _run(ids("h", "m", "1", "2", "3"), "inside", budget=0)
    assert out == ids("</think>", "0", "1", "2") + [EOS]  # "h" and "m" were not allowed
    out, inner = _run(ids("<think>", "h", "1"), "start", budget=0)  # may not even open it
    assert out == ids("0", "0", "1") + [EOS] and inner.accepted == out


def test_budget_counts_after_an_opened_block_and_gates_a_free_answer() -> None:
    script = ids("<think>", "a", "b", "c", "x", "y")
    out, _ = _run(script, "start", budget=2, inner=FreeGrammar())
    assert out[:4] == ids("<think>", "a", "b", "</think>")
    assert out[4:6] == ids("x", "y")  # no grammar of its own: the answer is free


def test_budget_rolls_back_across_the_closing() -> None:
    g = ReasonerGrammar(DigitsGrammar(), TokenTexts(TEXTS), "<think>", "</think>", "inside", 1)
    g.accept_token(ID["a"])
    assert g.phase == "closing"
    mask = torch.full((1, 4), -1, dtype=torch.int32)
    g.fill_vocab_mask(mask, 0)
    allowed = set(mask_to_bool(mask[0], VOCAB).nonzero().flatten().tolist())
    assert allowed == {ID["</think>"], ID["</"], ID["<"]}
    g.accept_token(ID["</think>"])
    assert g.phase == "active"
    g.rollback(2)
    assert g.phase == "reasoning"
