"""Priority scheduling (policy.PriorityOrder) and the SGLang-style batch log lines,
against the fake runner of test_scheduler.py: the order in which requests finish,
preemption past the threshold (by request slots and by KV), the retraction victim,
and outputs that stay those of each request run alone."""

from __future__ import annotations

import logging

import pytest

from radixlm.messages.io_struct import AbortReq, TokenizedGenerateReq
from radixlm.messages.sampling_params import SamplingParams
from radixlm.scheduler.scheduler import Scheduler
from tests.scheduler.test_scheduler import expected, make_scheduler

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def submit(s: Scheduler, rid: str, priority: int, max_new_tokens: int = 4,
           prompt: list[int] = PROMPT) -> None:
    sp = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    s.add_request(TokenizedGenerateReq(rid=rid, input_ids=prompt, sampling_params=sp,
                                       priority=priority))


def finish_order(s: Scheduler, max_steps: int = 3000) -> tuple[list[str], dict[str, list[int]]]:
    order: list[str] = []
    tokens: dict[str, list[int]] = {}
    for _ in range(max_steps):
        if not s.has_work:
            return order, tokens
        for out in s.step():
            tokens.setdefault(out.rid, []).extend(out.new_token_ids)
            if out.finished_reason is not None:
                order.append(out.rid)
        s.check_integrity()
    raise AssertionError("scheduler did not finish")


@pytest.mark.parametrize("low_first", [False, True])
def test_waiting_requests_run_by_priority_then_arrival(low_first: bool) -> None:
    s = make_scheduler(max_running_requests=1, enable_priority_scheduling=True,
                       schedule_low_priority_values_first=low_first)
    submit(s, "first", 0, max_new_tokens=20)
    s.step()  # "first" runs; the others queue behind it
    for rid, prio in (("p1a", 1), ("p1b", 1), ("p2", 2)):
        submit(s, rid, -prio if low_first else prio)
    order, tokens = finish_order(s)
    assert order == ["first", "p2", "p1a", "p1b"]  # within the threshold: no preemption
    assert s.num_preemptions == 0
    assert tokens["p2"] == expected(PROMPT, 4)


def test_without_priority_scheduling_the_queue_is_fcfs() -> None:
    s = make_scheduler(max_running_requests=1, schedule_policy="fcfs")
    submit(s, "first", 0, max_new_tokens=20)
    s.step()
    for rid, prio in (("a", 1), ("b", 50)):
        submit(s, rid, prio)
    assert finish_order(s)[0] == ["first", "a", "b"]


def test_a_request_past_the_threshold_preempts_a_running_one() -> None:
    # SGLang's test: 0 runs, 10 arrives (not past the threshold), 20 preempts 0.
    s = make_scheduler(max_running_requests=1, schedule_policy="priority")
    submit(s, "p0", 0, max_new_tokens=30)
    s.step()
    submit(s, "p10", 10, max_new_tokens=30)
    s.step()
    assert [r.rid for r in s.running] == ["p0"]
    submit(s, "p20", 20, max_new_tokens=30)
    order, tokens = finish_order(s)
    assert order == ["p20", "p10", "p0"]
    assert s.num_preemptions >= 1 and s.num_retractions >= 1
    assert tokens["p0"] == expected(PROMPT, 30)  # resumed with nothing lost


def test_preemption_frees_kv_for_the_urgent_request() -> None:
    # The pool holds the two background requests' KV; the urgent one needs theirs.
    s = make_scheduler(num_tokens=96, schedule_conservativeness=0.0,
                       enable_priority_scheduling=True)
    long_prompt = list(range(1, 31))
    submit(s, "bg1", 0, max_new_tokens=15, prompt=long_prompt)
    submit(s, "bg2", 0, max_new_tokens=15, prompt=long_prompt[::-1])
    for _ in range(3):
        s.step()
    assert len(s.running) == 2
    urgent = [7] * 40
    submit(s, "urgent", 100, max_new_tokens=8, prompt=urgent)
    s.step()
    assert "urgent" in [r.rid for r in s.running]
    order, tokens = finish_order(s)
    assert order[0] == "urgent" and s.num_preemptions >= 1
    assert tokens["urgent"] == expected(urgent, 8)
    assert tokens["bg1"] == expected(long_prompt, 15)
    assert tokens["bg2"] == expected(long_prompt[::-1], 15)


def test_no_preemption_when_disabled_or_when_it_cannot_make_room() -> None:
    s = make_scheduler(max_running_requests=1, enable_priority_scheduling=True,
                       disable_priority_preemption=True)
    submit(s, "p0", 0, max_new_tokens=10)
    s.step()
    submit(s, "p99", 99)
    assert finish_order(s)[0] == ["p0", "p99"] and s.num_preemptions == 0


def test_memory_pressure_retracts_the_least_urgent_first() -> None:
    s = make_scheduler(num_tokens=80, schedule_conservativeness=0.0,
                       enable_priority_scheduling=True, disable_priority_preemption=True)
    submit(s, "low", 0, max_new_tokens=40, prompt=list(range(1, 11)))
    s.step()
    submit(s, "high", 5, max_new_tokens=40, prompt=list(range(11, 21)))  # the newest
    retracted: set[str] = set()
    for _ in range(200):
        if not s.has_work:
            break
        s.step()
        retracted |= {r.rid for r in s.waiting if r.num_retractions}
    assert s.num_retractions >= 1
    assert retracted == {"low"}


def test_batch_log_lines_as_sglang_prints_them(caplog: pytest.LogCaptureFixture) -> None:
    s = make_scheduler(decode_log_interval=3)
    with caplog.at_level(logging.INFO):
        submit(s, "a", 0, max_new_tokens=8)
        submit(s, "b", 0, max_new_tokens=8)
        s.step()
        s.abort(AbortReq(rid="b", message="Client disconnected"))
        finish_order(s)
    lines = [r.getMessage() for r in caplog.records]
    prefill = [ln for ln in lines if ln.startswith("Prefill batch.")]
    decode = [ln for ln in lines if ln.startswith("Decode batch.")]
    assert prefill[0].startswith(
        "Prefill batch. #new-seq: 2, #new-token: 16, #cached-token: 0, token usage: ")
    assert "#running-req: 0, #queue-req: 0," in prefill[0]
    assert len(decode) == 7 // 3  # 7 decode steps of "a", one line every 3
    assert decode[0].startswith("Decode batch. #running-req: 1, #token: ")
    for field in ("token usage: ", "cache hit rate: ", "gen throughput (token/s): ",
                  "#queue-req: 0,"):
        assert field in decode[0]
    assert "Abort running request. rid='b', reason: Client disconnected" in lines


def _abort_messages(s: Scheduler) -> dict[str, str | None]:
    """Finished-by-abort requests and their messages, from the outputs of one step."""
    return {out.rid: out.finished_reason.message for out in s.step()
            if out.finished_reason is not None and out.finished_reason.type == "abort"}


@pytest.mark.parametrize("low_first", [False, True])
def test_full_queue_aborts_the_least_urgent_waiting_request(low_first: bool) -> None:
    sign = -1 if low_first else 1
    s = make_scheduler(max_running_requests=1, max_queued_requests=2,
                       enable_priority_scheduling=True,
                       schedule_low_priority_values_first=low_first)
    submit(s, "running", 0, max_new_tokens=20)
    s.step()
    submit(s, "low", sign * 1)
    submit(s, "mid", sign * 5)  # the queue is full now
    submit(s, "urgent", sign * 9)  # more urgent than "low": "low" goes, SGLang's words
    submit(s, "lowest", sign * -3)  # less urgent than every waiting one: refused itself
    aborted = _abort_messages(s)
    assert aborted == {"low": "The request is aborted by a higher priority request.",
                       "lowest": "The request queue is full."}
    order, _ = finish_order(s)
    assert order == ["running", "urgent", "mid"]


def test_full_queue_without_priority_refuses_the_newcomer() -> None:
    s = make_scheduler(max_running_requests=1, max_queued_requests=1)
    submit(s, "running", 0, max_new_tokens=20)
    s.step()
    submit(s, "a", 0)
    submit(s, "b", 100)
    assert _abort_messages(s) == {"b": "The request queue is full."}
