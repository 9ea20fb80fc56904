"""The scheduler: one loop of receive → schedule → run → process.

It owns the requests, the memory pools and the prefix cache (through
`KVManager`), and the model runner. `schedule()` explains the step algorithm;
finishing and output messages live in `output_processor.py`; the process
entry point and the ZMQ loop live in `process.py`.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from radixlm.io_struct import (
    AbortReq,
    FinishReason,
    FlushCacheOut,
    ServerInfoOut,
    TokenizedGenerateReq,
    TokenOut,
)
from radixlm.scheduler.grammar_manager import GrammarManager
from radixlm.scheduler.jump_forward import JumpForward
from radixlm.scheduler.kv_manager import KVManager
from radixlm.scheduler.output_processor import OutputProcessor
from radixlm.scheduler.policy import NewTokenRatio, order_waiting
from radixlm.scheduler.request import Req, ScheduledReq, StepPlan
from radixlm.server_args import ServerArgs

if TYPE_CHECKING:
    from radixlm.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(
        self,
        server_args: ServerArgs,
        runner: ModelRunner,
        tokenizer: Any,
        grammars: GrammarManager | None = None,
    ) -> None:
        """grammars: compiles constrained requests' grammars; None serves no grammars."""
        self.args = server_args
        self.runner = runner
        self.kv = KVManager(
            runner.req_to_token_pool,
            runner.token_to_kv_pool,
            runner.prefix_cache,
            shares_prefixes=not server_args.disable_radix_cache,
        )
        self.output = OutputProcessor(server_args, tokenizer, runner.eos_token_ids,
                                      runner.context_len)
        self.grammars = grammars
        self.jump_forward = (
            None if server_args.disable_jump_forward
            else JumpForward(tokenizer, runner.context_len)
        )
        self.waiting: list[Req] = []
        self.running: list[Req] = []  # admitted, in admission order
        self.new_token_ratio = NewTokenRatio(init=server_args.schedule_conservativeness * 0.5)
        # n > 1 groups: the leader prefills the shared prompt; the rest wait until
        # the group is ready (its prompt is in the prefix cache).
        self.group_leader: dict[str, str] = {}
        self.group_ready: set[str] = set()
        self.group_remaining: dict[str, int] = {}
        self.num_arrivals = 0
        self.num_admissions = 0
        self.num_retractions = 0
        self.num_steps = 0
        self.last_step_time = time.monotonic()

    # ------------------------------------------------------------------ input

    def add_request(self, msg: TokenizedGenerateReq) -> None:
        req = Req(msg, self.num_arrivals)
        self.num_arrivals += 1
        if req.group_id is not None:
            self.group_remaining[req.group_id] = self.group_remaining.get(req.group_id, 0) + 1
        if req.num_fill_tokens + req.sampling_params.max_new_tokens > self.kv.kv_pool.size:
            # It could never fit, even alone: fail now instead of thrashing later.
            self._fail(req, f"Request needs more KV slots than the pool has "
                       f"({self.kv.kv_pool.size}); raise --max-total-tokens")
            return
        if req.grammar_key is not None:
            if self.grammars is None:
                self._fail(req, "Grammar-constrained decoding is disabled on this server")
            else:
                self.grammars.add(req)
            return
        self.waiting.append(req)

    def _fail(self, req: Req, message: str, status_code: int | None = 400) -> None:
        """Finish a request that is not running (an error for the user, or an abort)."""
        req.finished_reason = FinishReason("abort", message=message, status_code=status_code)
        self.output.pending_finished.append(req)

    def _take_compiled_grammars(self) -> None:
        """Constrained requests whose grammar is ready join the waiting queue."""
        if self.grammars is None or not self.grammars.has_pending:
            return
        polled = self.grammars.poll()
        self.waiting.extend(polled.ready)
        for req, message in polled.failed:
            logger.info("Request %s: %s", req.rid, message)  # the client sees it cleaned
            self._fail(req, message)

    def abort(self, msg: AbortReq) -> None:
        def matches(req: Req) -> bool:
            return msg.abort_all or req.rid == msg.rid or req.rid.startswith(f"{msg.rid}#")

        queues = [self.waiting] + ([self.grammars.queue] if self.grammars is not None else [])
        for queue in queues:
            for req in [r for r in queue if matches(r)]:
                queue.remove(req)
                self._fail(req, msg.message, status_code=None)
        for req in self.running:
            if matches(req) and not req.finished:
                req.finished_reason = FinishReason("abort", message=msg.message)
        self._release_finished()

    def flush_cache(self) -> FlushCacheOut:
        if self.waiting or self.running or self.num_compiling:
            return FlushCacheOut(False, "Cannot flush the cache while requests are running")
        self.kv.cache.reset()
        return FlushCacheOut(True)

    def server_info(self) -> ServerInfoOut:
        info: dict[str, Any] = dict(self.kv.stats())
        info.update(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            num_compiling_reqs=self.num_compiling,
            num_retractions=self.num_retractions,
            num_steps=self.num_steps,
            new_token_ratio=round(self.new_token_ratio.value, 4),
            context_length=self.runner.context_len,
            grammar_mask_seconds_total=round(self.runner.grammar_mask_seconds, 6),
            num_grammar_mask_steps=self.runner.num_grammar_mask_steps,
        )
        info.update(self.output.stats())
        return ServerInfoOut(info)

    def runner_info(self) -> dict[str, Any]:
        runner = self.runner
        return {
            "architectures": list(getattr(runner.config, "architectures", None) or []),
            "context_length": runner.context_len,
            "vocab_size": runner.vocab_size,
            "max_total_num_tokens": self.kv.kv_pool.size,
            "eos_token_ids": sorted(runner.eos_token_ids),
            "is_generation": True,
        }

    @property
    def num_compiling(self) -> int:
        """Constrained requests waiting for their grammar."""
        return len(self.grammars.queue) if self.grammars is not None else 0

    @property
    def has_work(self) -> bool:
        return bool(
            self.waiting or self.running or self.output.pending_finished or self.num_compiling
        )

    @property
    def can_step_now(self) -> bool:
        """False when the only work is grammars still compiling (poll, don't spin)."""
        return bool(self.waiting or self.running or self.output.pending_finished)

    # ------------------------------------------------------------------ step

    def step(self) -> list[TokenOut]:
        """Run one step if there is work; return the outputs to send."""
        self._take_compiled_grammars()
        plan = self.schedule()
        if plan is not None:
            result = self.runner.forward(plan)
            for item in plan.items:
                item.req.kv_len = item.prefix_len + item.extend_len
                item.req.num_forward_steps += 1
            self.output.process(plan, result)
            for item in plan.items:
                req = item.req
                if item.samples and req.grammar is not None:
                    self._jump_forward(req)
                if item.extend_len > 1 and item.prefix_len < len(req.origin_input_ids) and not req.finished:
                    self._on_prefill_progress(req)
            self._release_finished()
            self.num_steps += 1
            self.new_token_ratio.step()
        self.last_step_time = time.monotonic()
        self._settle_groups()
        return self.output.collect(self.running)

    def schedule(self) -> StepPlan | None:
        """Build the next step under one token budget.

        There is no prefill phase and no decode phase. Every admitted request
        is behind its token list by `num_pending_tokens`; the step hands out a
        budget of `max_prefill_tokens` tokens:
        1. every decoding request (1 pending token) gets its token; if the KV
           pool cannot hold them even after evicting the cache, the newest
           requests are retracted until it can;
        2. requests part-way through their prompt get chunks of at most
           `chunked_prefill_size` while budget and memory last;
        3. waiting requests are admitted in policy order while there is a
           request slot, budget, and KV beyond what running requests reserve.
        """
        self._retract_until_decodes_fit()
        items: list[ScheduledReq] = []
        budget = self.args.max_prefill_tokens
        for req in self.running:
            if req.num_pending_tokens == 1:
                items.append(self._plan_item(req, 1))
                budget -= 1
        for req in self.running:
            if req.num_pending_tokens > 1 and budget > 0:
                budget -= self._try_extend(req, budget, items)
        if budget > 0:
            budget = self._admit(budget, items)
        if not items:
            if self.running:
                # Every running request is mid-prefill and none fits: free memory.
                self._retract(max(self.running, key=lambda r: r.admit_seq))
            return None
        num_tokens = sum(it.extend_len for it in items)
        allocated = self.kv.alloc_slots(num_tokens)
        assert allocated is not None, "step planned beyond available KV"
        offset = 0
        for it in items:
            part = allocated[offset : offset + it.extend_len]
            self.kv.assign_slots(it.req, it.prefix_len, part)
            offset += it.extend_len
        return StepPlan(items, allocated)

    def _plan_item(self, req: Req, extend_len: int) -> ScheduledReq:
        prefix_len = req.kv_len
        samples = prefix_len + extend_len == req.num_fill_tokens
        positions = None
        if req.wants_input_logprobs:
            # Logits at position p score prompt token p + 1.
            first = max(req.logprob_start_len - 1, 0)
            last = len(req.origin_input_ids) - 1  # exclusive of the sampling position
            lo, hi = max(first, prefix_len), min(last, prefix_len + extend_len)
            if lo < hi:
                positions = (lo, hi)
        return ScheduledReq(req, prefix_len, extend_len, samples, positions)

    def _chunk_len(self, req: Req, budget: int) -> int:
        return min(req.num_pending_tokens, self.args.chunked_prefill_size, budget)

    def _try_extend(self, req: Req, budget: int, items: list[ScheduledReq]) -> int:
        """Schedule a chunk of a running request's pending tokens if memory allows."""
        n = self._chunk_len(req, budget)
        planned = sum(it.extend_len for it in items)
        if n <= 0 or self.kv.num_available_slots() - planned < n:
            return 0
        items.append(self._plan_item(req, n))
        return n

    def _admit(self, budget: int, items: list[ScheduledReq]) -> int:
        order_waiting(self.waiting, self.args.schedule_policy, self.kv.prefix_hit_len)
        admitted: list[Req] = []
        for req in self.waiting:
            if budget <= 0 or len(self.running) >= self.args.max_running_requests:
                break
            if not self.kv.can_admit():
                break
            if not self._group_allows(req):
                continue
            planned = sum(it.extend_len for it in items)
            reserve = self.new_token_ratio.reserve(self.running + [req])
            # Locking the prefix makes it unevictable, so check after admitting.
            self.kv.admit(req)
            n = self._chunk_len(req, budget)
            available = self.kv.num_available_slots() - planned
            if available < n or (self.running and available - reserve < n):
                self.kv.release(req)
                req.reset_memory_state()
                break
            req.admit_seq = self.num_admissions
            self.num_admissions += 1
            if req.num_cached_tokens is None:
                req.num_cached_tokens = req.kv_len
            self.running.append(req)
            admitted.append(req)
            items.append(self._plan_item(req, n))
            budget -= n
        for req in admitted:
            self.waiting.remove(req)
        return budget

    def _group_allows(self, req: Req) -> bool:
        """n > 1: the first sample prefills the prompt; the others wait to share it."""
        gid = req.group_id
        if gid is None or not self.kv.shares_prefixes or gid in self.group_ready:
            return True
        return self.group_leader.setdefault(gid, req.rid) == req.rid

    def _jump_forward(self, req: Req) -> None:
        """Append the text req's grammar forces; the next step computes it as an extend."""
        if self.jump_forward is None or req.finished:
            return
        num_new = self.jump_forward.try_jump(req, self.kv)
        if num_new > 0:
            req.finished_reason = self.output.check_length_and_stop_strings(req, num_new)

    def _on_prefill_progress(self, req: Req) -> None:
        self.kv.cache_unfinished(req)
        if req.group_id is not None and req.kv_len >= len(req.origin_input_ids) - 1:
            self.group_ready.add(req.group_id)

    # ------------------------------------------------------------------ memory pressure

    def _retract_until_decodes_fit(self) -> None:
        """Retract the newest requests until every decode's next token has a slot."""
        while self.running:
            num_decodes = sum(1 for r in self.running if r.num_pending_tokens == 1)
            if self.kv.num_available_slots() >= num_decodes:
                return
            if len(self.running) == 1:
                req = self.running[0]
                req.finished_reason = FinishReason(
                    "abort", message="Out of KV cache memory for this request")
                self._release_finished()
                return
            self._retract(max(self.running, key=lambda r: r.admit_seq))

    def _retract(self, victim: Req) -> None:
        self.running.remove(victim)
        self.kv.release(victim)
        victim.reset_for_retraction()
        self.waiting.append(victim)
        self.num_retractions += 1
        self.new_token_ratio.on_retract()
        logger.info("Retracted %s (KV full); %d running", victim.rid, len(self.running))

    # ------------------------------------------------------------------ finishing

    def _release_finished(self) -> None:
        still: list[Req] = []
        for req in self.running:
            if req.finished:
                self.kv.release(req)
                self.output.pending_finished.append(req)
            else:
                still.append(req)
        self.running = still

    def _settle_groups(self) -> None:
        """Account finished members of n > 1 groups; a finished member unblocks the rest."""
        for req in self.output.pending_finished:
            gid = req.group_id
            if gid is None:
                continue
            self.group_ready.add(gid)
            left = self.group_remaining.get(gid, 1) - 1
            if left <= 0:
                self.group_remaining.pop(gid, None)
                self.group_leader.pop(gid, None)
                self.group_ready.discard(gid)
            else:
                self.group_remaining[gid] = left

    def check_integrity(self) -> None:
        self.kv.check_integrity(self.running)
