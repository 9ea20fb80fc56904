"""The scheduler against a fake runner: budgets, chunking, retraction, prefix sharing.

The fake model's next token is a pure function of the whole sequence so far,
so any scheduling (batching, chunking, retraction, cache hits) must give the
same outputs as running each request alone; `check_integrity` runs after
every step.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from radixlm.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixlm.messages.forward_step import ForwardStep, StepResult
from radixlm.messages.io_struct import AbortReq, TokenizedGenerateReq
from radixlm.messages.sampling_params import SamplingParams
from radixlm.scheduler.scheduler import Scheduler
from radixlm.server_args import ServerArgs

VOCAB = 97
EOS = 0


def next_token(seq: list[int]) -> int:
    return (sum(seq) * 31 + len(seq)) % (VOCAB - 1) + 1  # never EOS


class FakeTokenizer:
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)


class FakeRunner:
    """The runner's contract with a fake model: its "KV" of a slot is the token written
    there, so the sequence it sees is read back through the request's req_to_token row
    (a wrong slot gives a wrong next token)."""

    is_generation = True
    needs_whole_prompt = False
    model = None

    def __init__(self, num_tokens: int, disable_radix: bool, context_len: int = 4096) -> None:
        self.token_to_kv_pool = TokenToKVPool(num_tokens, 1, 1, 1, __import__("torch").float32)
        self.req_to_token_pool = ReqToTokenPool(64, context_len + 8)
        self.eos_token_ids = {EOS}
        self.context_len = context_len
        self.vocab_size = VOCAB
        self.config = None
        self.num_forward_tokens = 0
        self.grammar_mask_seconds = 0.0
        self.num_grammar_mask_steps = 0
        self.kv_tokens: dict[int, int] = {}  # KV slot -> the token whose "KV" it holds
        self.steps: list[ForwardStep] = []

    def forward(self, step: ForwardStep) -> StepResult:
        self.steps.append(step)
        slots = step.out_cache_loc.tolist()
        ids: list[int] = []
        offset = 0
        for item in step.items:
            for slot, token in zip(slots[offset : offset + item.extend_len], item.input_ids):
                self.kv_tokens[slot] = token
            offset += item.extend_len
            # The KV of every token up to the end of this step's chunk must be in place.
            row = self.req_to_token_pool.req_to_token[item.req_pool_idx]
            end = item.prefix_len + item.extend_len
            assert bool((row[:end] > 0).all()), "a token has no KV slot"
            self.num_forward_tokens += item.extend_len
            if item.num_sample_rows:
                ids.append(next_token([self.kv_tokens[s] for s in row[:end].tolist()]))
        n = len(ids)
        return StepResult(ids, [None] * n, [None] * n, [None] * len(step.items))


def make_scheduler(num_tokens: int = 4096, **kwargs: object) -> Scheduler:
    args = ServerArgs(**kwargs)  # type: ignore[arg-type]
    runner = FakeRunner(num_tokens, args.disable_radix_cache)
    return Scheduler(args, runner, FakeTokenizer())  # type: ignore[arg-type]


def submit(s: Scheduler, rid: str, prompt: list[int], **params: object) -> None:
    sp = SamplingParams(**{"max_new_tokens": 8, "temperature": 0.0, **params})  # type: ignore[arg-type]
    s.add_request(TokenizedGenerateReq(rid=rid, input_ids=prompt, sampling_params=sp))


def run_all(s: Scheduler, max_steps: int = 5000) -> dict[str, list[int]]:
    results: dict[str, list[int]] = {}
    acc: dict[str, list[int]] = {}
    for _ in range(max_steps):
        if not s.has_work:
            return results
        for out in s.step():
            acc.setdefault(out.rid, []).extend(out.new_token_ids)
            if out.finished_reason is not None:
                results[out.rid] = acc.pop(out.rid)
        s.check_integrity()
    raise AssertionError("scheduler did not finish")


def expected(prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    for _ in range(n):
        seq.append(next_token(seq))
    return seq[len(prompt):]


def prompts(k: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(1, VOCAB) for _ in range(20)]
    return [shared[: rng.randrange(0, 20)] + [rng.randrange(1, VOCAB) for _ in range(
        rng.randrange(1, 40))] for _ in range(k)]


@pytest.mark.parametrize("config", [
    {},
    {"disable_radix_cache": True},
    {"chunked_prefill_size": 7},
    {"max_prefill_tokens": 16, "chunked_prefill_size": 5},
    {"max_running_requests": 3},
    {"schedule_policy": "lpm"},
])
def test_outputs_match_sequential(config: dict) -> None:
    s = make_scheduler(**config)
    ps = prompts(12)
    for i, p in enumerate(ps):
        submit(s, f"r{i}", p, max_new_tokens=10)
    results = run_all(s)
    for i, p in enumerate(ps):
        assert results[f"r{i}"] == expected(p, 10)
    assert s.kv.kv_pool.available_size() + s.kv.cache.total_size() == s.kv.kv_pool.size


def test_retraction_under_memory_pressure_keeps_outputs() -> None:
    s = make_scheduler(num_tokens=160, schedule_conservativeness=0.0)
    ps = prompts(8, seed=1)
    for i, p in enumerate(ps):
        submit(s, f"r{i}", p, max_new_tokens=40)
    results = run_all(s)
    assert s.num_retractions > 0
    for i, p in enumerate(ps):
        assert results[f"r{i}"] == expected(p, 40)


def test_prefix_hit_is_reported_and_reused() -> None:
    s = make_scheduler()
    p = list(range(1, 30))
    submit(s, "a", p)
    run_all(s)
    runner = s.runner
    before = runner.num_forward_tokens
    submit(s, "b", p)
    s.step()
    req = s.running[0] if s.running else None
    run_all(s)
    assert runner.num_forward_tokens - before <= 1 + 8  # last prompt token + decodes
    assert req is None or req.num_cached_tokens == len(p) - 1


def test_images_share_the_cache_only_when_identical() -> None:
    """Pad ids stand for an image: the same image reuses its KV, another one does not."""
    import torch

    from radixlm.messages.mm_inputs import MultimodalInputs, MultimodalItem, pad_value_for

    def image_prompt(content_hash: int) -> tuple[list[int], MultimodalInputs]:
        pad = pad_value_for(content_hash, VOCAB)
        item = MultimodalItem("image", content_hash, pad, 2, 6, torch.zeros(3, 2, 2))
        return [5, 6] + [pad] * 6 + [7, 8], MultimodalInputs([item])

    s = make_scheduler()
    cached: dict[str, int] = {}
    for rid, content_hash in (("a", 11), ("b", 11), ("c", 12)):
        ids, mm = image_prompt(content_hash)
        sp = SamplingParams(max_new_tokens=3, temperature=0.0)
        s.add_request(TokenizedGenerateReq(rid=rid, input_ids=ids, sampling_params=sp,
                                           mm_inputs=mm))
        assert s.waiting[-1].mm_inputs is mm
        while s.has_work:
            for out in s.step():
                if out.finished_reason is not None:
                    cached[rid] = out.cached_tokens
        assert run_all(s) == {}
    assert cached == {"a": 0, "b": 9, "c": 2}


def test_parallel_samples_share_the_prompt() -> None:
    s = make_scheduler()
    p = list(range(1, 50))
    for i in range(4):
        sp = SamplingParams(max_new_tokens=4, temperature=0.0)
        s.add_request(TokenizedGenerateReq(rid=f"g#{i}", input_ids=p, sampling_params=sp,
                                           group_id="g"))
    run_all(s)
    # One full prefill, then each follower computes only the last prompt token.
    assert s.runner.num_forward_tokens <= len(p) + 3 + 4 * 4
    assert not s.groups.leader and not s.groups.ready and not s.groups.remaining


def test_abort_running_and_waiting() -> None:
    s = make_scheduler(max_running_requests=2)
    for i in range(5):
        submit(s, f"r{i}", [1, 2, 3, i + 1], max_new_tokens=100)
    s.step()
    s.abort(AbortReq(abort_all=True))
    outs = s.step()
    assert {o.rid for o in outs} == {f"r{i}" for i in range(5)}
    assert all(o.finished_reason is not None and o.finished_reason.type == "abort" for o in outs)
    assert not s.has_work
    s.check_integrity()


def test_stop_token_and_length_reasons() -> None:
    s = make_scheduler()
    p = [5, 6, 7]
    first = expected(p, 1)[0]
    submit(s, "stop", p, stop_token_ids=[first])
    submit(s, "len", p, max_new_tokens=3)
    reasons = {}
    for _ in range(100):
        for out in s.step():
            if out.finished_reason:
                reasons[out.rid] = out.finished_reason
        if not s.has_work:
            break
    assert reasons["stop"].type == "stop" and reasons["stop"].matched == first
    assert reasons["len"].type == "length"


def test_request_larger_than_pool_is_rejected() -> None:
    s = make_scheduler(num_tokens=32)
    submit(s, "big", list(range(1, 30)), max_new_tokens=10)
    outs = s.step()
    assert outs[0].finished_reason is not None and outs[0].finished_reason.type == "abort"


def test_server_args_are_frozen() -> None:
    args = ServerArgs()
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.port = 1  # type: ignore[misc]


def test_a_row_without_a_valid_distribution_fails_its_request_alone() -> None:
    s = make_scheduler()
    runner = s.runner
    real_forward = runner.forward

    def forward(step: ForwardStep) -> StepResult:
        result = real_forward(step)
        row_rids = [item.rid for item in step.items for _ in range(item.num_sample_rows)]
        ids = [None if rid == "nan" else t for rid, t in zip(row_rids, result.next_token_ids)]
        return result._replace(next_token_ids=ids)

    runner.forward = forward  # type: ignore[method-assign]
    for rid in ("a", "nan", "b"):
        submit(s, rid, [5, 6, 7])
    finished: dict[str, object] = {}
    tokens: dict[str, list[int]] = {}
    for _ in range(100):
        if not s.has_work:
            break
        for out in s.step():
            tokens.setdefault(out.rid, []).extend(out.new_token_ids)
            if out.finished_reason is not None:
                finished[out.rid] = out.finished_reason
        s.check_integrity()
    reason = finished["nan"]
    assert reason.type == "abort" and reason.status_code == 500  # type: ignore[attr-defined]
    assert "no valid next-token distribution" in reason.message  # type: ignore[attr-defined]
    assert tokens["nan"] == []
    assert tokens["a"] == tokens["b"] == expected([5, 6, 7], 8)


def test_a_full_waiting_queue_refuses_new_requests_with_503() -> None:
    s = make_scheduler(max_queued_requests=2)
    for rid in ("a", "b", "c"):
        submit(s, rid, [5, 6, 7])
    assert [r.rid for r in s.waiting] == ["a", "b"]
    refused = s.output.pending_finished
    assert [r.rid for r in refused] == ["c"]
    reason = refused[0].finished_reason
    assert reason is not None and reason.status_code == 503
    assert reason.message == "The request queue is full."
    s.step()  # a and b are admitted: the queue has room again
    submit(s, "d", [5, 6, 7])
    assert [r.rid for r in s.waiting] == ["d"]
    assert set(run_all(s)) >= {"a", "b", "d"}
