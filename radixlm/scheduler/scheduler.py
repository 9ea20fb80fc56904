"""The scheduler: one loop of receive → schedule → run → process.

It owns the requests, the memory pools and the prefix cache (through
`KVManager`), and the model runner. `schedule()` explains the step
algorithm; `_process()` is the one place that changes requests after a
forward pass, with the sampled tokens accepted in `acceptance.py`; finish
checks and output messages live in `output_processor.py`; the answers to
control messages (server info, cache flush, weight updates) in `control.py`;
the process entry point and the ZMQ loop in `process.py`.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from radixlm.mem_cache import create_prefix_cache
from radixlm.messages.forward_step import StepResult
from radixlm.messages.io_struct import (
    AbortReq,
    FinishReason,
    TokenizedGenerateReq,
    TokenOut,
    is_sample_of,
)
from radixlm.scheduler.acceptance import TokenAcceptor
from radixlm.scheduler.batch_log import BatchLog
from radixlm.scheduler.budget import StepBudget
from radixlm.scheduler.grammar_manager import GrammarManager, build_vocab_mask
from radixlm.scheduler.groups import SampleGroups
from radixlm.scheduler.jump_forward import JumpForward
from radixlm.scheduler.kv_disk import build_disk_tier
from radixlm.scheduler.kv_manager import KVManager
from radixlm.scheduler.ngram_drafter import NgramDrafter
from radixlm.scheduler.output_processor import OutputProcessor
from radixlm.scheduler.policy import NewTokenRatio, PriorityOrder, order_waiting
from radixlm.scheduler.preemption import Retractor
from radixlm.scheduler.profiler import Profiler
from radixlm.scheduler.request import Req
from radixlm.scheduler.step_plan import ScheduledReq, StepPlan
from radixlm.server_args import ServerArgs
from radixlm.tokenizer_utils import TokenDecoder

if TYPE_CHECKING:
    from radixlm.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(
        self,
        server_args: ServerArgs,
        runner: ModelRunner,
        tokenizer: TokenDecoder | None,
        grammars: GrammarManager | None = None,
    ) -> None:
        """grammars: compiles constrained requests' grammars; None serves no grammars.
        tokenizer: None with --skip-tokenizer-init (no stop strings, no jump-forward)."""
        self.args = server_args
        self.runner = runner
        # NOTE: a pool without layers (an encoder writes no KV) has no prefix to share.
        prefix_cache = create_prefix_cache(
            runner.token_to_kv_pool,
            server_args.disable_radix_cache or runner.token_to_kv_pool.num_layers == 0)
        self.kv = KVManager(
            runner.req_to_token_pool,
            runner.token_to_kv_pool,
            prefix_cache,
            shares_prefixes=not server_args.disable_radix_cache,
            disk_tier=build_disk_tier(server_args, runner, prefix_cache),
            write_through=server_args.kv_cache_disk_write_policy == "write_through",
        )
        self.output = OutputProcessor(server_args, tokenizer, runner.eos_token_ids,
                                      runner.context_len)
        self.grammars = grammars
        self.jump_forward = (
            None if server_args.disable_jump_forward or tokenizer is None
            else JumpForward(tokenizer, runner.context_len)
        )
        self.drafter = (
            NgramDrafter(server_args, runner.vocab_size, runner.context_len,
                         jump_forward=self.jump_forward is not None)
            if server_args.speculative_algorithm == "NGRAM" else None
        )
        self.acceptor = TokenAcceptor(self.kv, self.output, self.jump_forward, self.drafter)
        self.waiting: list[Req] = []
        self.running: list[Req] = []  # admitted, in admission order
        self.new_token_ratio = NewTokenRatio(init=server_args.schedule_conservativeness * 0.5)
        self.priority = PriorityOrder(
            server_args.priority_scheduling, server_args.schedule_low_priority_values_first,
            server_args.priority_scheduling_preemption_threshold,
            preempts=not server_args.disable_priority_preemption)
        self.batch_log = BatchLog(server_args.decode_log_interval)
        self.groups = SampleGroups(shares_prefixes=self.kv.shares_prefixes)
        self.retractor = Retractor(server_args, self.kv, self.priority, self.new_token_ratio,
                                   self.groups)
        self.released_rids: list[str] = []  # finished since the last step (the runner forgets)
        self.num_arrivals = 0
        self.num_admissions = 0
        self.num_steps = 0
        self.grammar_fill_seconds = 0.0  # filling grammar masks (the runner applies them)
        # Wall time of forward passes (masks included) by the step's kind (metrics).
        self.forward_seconds = {"extend": 0.0, "decode": 0.0, "mixed": 0.0}
        self.profiler = Profiler(server_args.profile_output_dir, server_args.device)

    # ------------------------------------------------------------------ input

    def add_request(self, msg: TokenizedGenerateReq) -> None:
        req = Req(msg, self.num_arrivals)
        req.whole_prompt = self.runner.needs_whole_prompt
        self.num_arrivals += 1
        self.groups.add(req)
        if req.num_tokens + req.sampling_params.max_new_tokens > self.kv.kv_pool.size:
            # It could never fit, even alone: fail now instead of thrashing later.
            self._fail(req, f"Request needs more KV slots than the pool has "
                       f"({self.kv.kv_pool.size}); raise --max-total-tokens")
            return
        limit = self.args.max_queued_requests
        if limit is not None and len(self.waiting) + self.num_compiling >= limit:
            if not self._abort_less_urgent(req):
                self._fail(req, "The request queue is full.", status_code=503)  # SGLang's words
                return
        if req.grammar_key is not None or req.sampling_params.gates_reasoning:
            if self.grammars is None:
                self._fail(req, "Grammar-constrained decoding (and thinking_token_budget) is "
                           "disabled on this server (--grammar-backend none)")
            else:
                self.grammars.add(req)
            return
        self.waiting.append(req)

    def _abort_less_urgent(self, req: Req) -> bool:
        """With priority scheduling and a full queue: abort the least urgent waiting
        request (the newest among equals; Batch API traffic first) if `req` is more
        urgent, as SGLang does; whether one was aborted."""
        if not self.priority.enabled or not self.waiting:
            return False

        def key(r: Req) -> tuple[bool, int, int]:
            return (r.background, self.priority.rank(r), r.arrival_seq)

        victim = max(self.waiting, key=key)
        if key(req)[:2] >= key(victim)[:2]:
            return False
        self.waiting.remove(victim)
        logger.info("Abort queued request %s for the more urgent %s", victim.rid, req.rid)
        self._fail(victim, "The request is aborted by a higher priority request.",
                   status_code=503)  # SGLang's words
        return True

    def _fail(self, req: Req, message: str, status_code: int | None = 400) -> None:
        """Finish a request that is not running (an error for the user, or an abort)."""
        req.finished_reason = FinishReason("abort", message=message, status_code=status_code)
        req.disk_load = None  # a load other requests do not share is then dropped
        self.output.pending_finished.append(req)
        self.released_rids.append(req.rid)  # a retracted request may have runner state

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
            return msg.abort_all or (msg.rid is not None and is_sample_of(req.rid, msg.rid))

        queues = [self.waiting] + ([self.grammars.queue] if self.grammars is not None else [])
        for queue in queues:
            for req in [r for r in queue if matches(r)]:
                queue.remove(req)
                logger.info("Abort queued request. rid=%r, reason: %s", req.rid, msg.message)
                self._fail(req, msg.message, status_code=None)
        for req in self.running:
            if matches(req) and not req.finished:
                logger.info("Abort running request. rid=%r, reason: %s", req.rid, msg.message)
                req.finished_reason = FinishReason("abort", message=msg.message)
        self._release_finished()

    @property
    def num_retractions(self) -> int:
        """Requests sent back to the waiting queue (memory or priority preemption)."""
        return self.retractor.num_retractions

    @property
    def num_preemptions(self) -> int:
        """Retractions for a more urgent request."""
        return self.retractor.num_preemptions

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
        """False when the only work is grammars still compiling or prefixes being read from
        the disk tier (poll, don't spin)."""
        return bool(self.running or self.output.pending_finished
                    or any(not self.kv.is_loading(r) for r in self.waiting))

    # ------------------------------------------------------------------ step

    def step(self) -> list[TokenOut]:
        """Run one step if there is work; return the outputs to send."""
        self._take_compiled_grammars()
        plan = self.schedule()
        if plan is not None:
            start = time.perf_counter()
            result = self._run(plan)
            self.forward_seconds[_step_kind(plan)] += time.perf_counter() - start
            self._process(plan, result)
            self.profiler.on_step()
        for req in self.output.pending_finished:
            self.groups.on_finished(req)
        return self.output.collect(self.running)

    def schedule(self) -> StepPlan | None:
        """Build the next step under one token budget.

        There is no prefill phase and no decode phase. Every admitted request
        is behind its token list by `num_pending_tokens`; the step hands out a
        budget of `max_prefill_tokens` tokens:
        1. every decoding request (1 pending token) gets its token; if the KV
           pool cannot hold them even after evicting the cache, the least
           urgent (then newest) requests are retracted until it can; with
           priority scheduling, running requests may also be preempted for a
           more urgent waiting one (preemption.py); with speculative decoding,
           decoding requests then add their drafted tokens while budget and
           KV slots last (ngram_drafter.py);
        2. requests part-way through their prompt get chunks of at most
           `chunked_prefill_size` while budget and memory last;
        3. waiting requests are admitted in policy order while there is a
           request slot, budget, and KV beyond what running requests reserve.
        """
        if self.retractor.retract_until_decodes_fit(self.running, self.waiting):
            self._release_finished()  # the one request left could not fit: aborted
        if self.priority.preempts and self.waiting and self.running:
            self.retractor.preempt_for_urgent(self.running, self.waiting)
        budget = StepBudget(self.args.max_prefill_tokens, self.kv.num_available_slots(),
                            self.args.chunked_prefill_size)
        items: list[ScheduledReq] = []
        for req in self.running:
            if req.num_pending_tokens == 1:
                budget.add_decode()
                items.append(ScheduledReq.plan(req, 1))
        if self.drafter is not None:
            self._add_drafts(items, budget)
        for req in self.running:
            if req.num_pending_tokens > 1 and budget.has_tokens:
                n = budget.chunk_len(req.num_pending_tokens)
                if budget.can_extend(n):
                    budget.extend(n)
                    items.append(ScheduledReq.plan(req, n))
        num_running = len(self.running)
        if budget.has_tokens:
            self._admit(budget, items)
        if not items:
            if self.running:
                # Every running request is mid-prefill and none fits: free memory.
                self.retractor.retract(self.retractor.victim(self.running), self.running,
                                       self.waiting)
            return None
        self._log_batch(items, num_running)
        allocated = self.kv.alloc_slots(sum(it.extend_len for it in items))
        assert allocated is not None, "step planned beyond available KV"
        offset = 0
        for it in items:
            self.kv.assign_slots(it.req, it.prefix_len, allocated[offset : offset + it.extend_len])
            offset += it.extend_len
        return StepPlan(items, allocated)

    def _add_drafts(self, decodes: list[ScheduledReq], budget: StepBudget) -> None:
        """Decoding requests that may draft verify their drafts in this step."""
        assert self.drafter is not None
        if not self.drafter.allows_batch(len(decodes)):
            return
        for item in decodes:
            if not item.num_sample_rows:
                continue
            draft = self.drafter.propose(item.req, budget.num_draft_rows(
                self.drafter.num_draft_tokens))
            if draft:
                budget.extend(len(draft))
                item.add_draft(draft)

    def _admit(self, budget: StepBudget, items: list[ScheduledReq]) -> None:
        """Admit waiting requests in policy order while each fits (see budget.py)."""
        order_waiting(self.waiting, self.args.schedule_policy, self.kv.prefix_hit_len,
                      self.priority)
        admitted: list[Req] = []
        for req in self.waiting:
            if not budget.has_tokens or len(self.running) >= self.args.max_running_requests:
                break
            if not self.kv.has_free_row():
                break
            if not self.groups.allows(req):
                continue
            match = self.kv.match_for_admission(req)
            if match is None:  # its prefix is being read from the disk tier
                continue
            pending = req.num_tokens - len(match.kv_indices)
            if req.whole_prompt:  # all of it in one step (alone if it exceeds the budget)
                n = pending if pending <= budget.num_tokens_left or not items else 0
            else:
                n = budget.chunk_len(pending)
            reserve = self.new_token_ratio.reserve(self.running + [req]) if self.running else None
            if n == 0 or not budget.can_admit(n, match.lock_cost, reserve):
                break
            budget.admit(n, match.lock_cost)
            self.kv.admit(req, match)
            req.admit_seq = self.num_admissions
            self.num_admissions += 1
            if req.num_cached_tokens is None:
                req.num_cached_tokens = req.kv_len
            self.running.append(req)
            admitted.append(req)
            items.append(ScheduledReq.plan(req, n))
        for req in admitted:
            self.waiting.remove(req)

    def _run(self, plan: StepPlan) -> StepResult:
        """The plan as the runner's plain ForwardStep, with the step's grammar masks."""
        start = time.perf_counter()
        vocab_mask = build_vocab_mask(plan.items, self.runner.vocab_size)
        if vocab_mask is not None:
            self.grammar_fill_seconds += time.perf_counter() - start
        step = plan.to_forward_step(vocab_mask, self.released_rids)
        self.released_rids = []
        return self.runner.forward(step)

    # ------------------------------------------------------------------ process

    def _process(self, plan: StepPlan, result: StepResult) -> None:
        """Apply one forward pass to its requests: the only place they change after it.

        Per item: its KV now reaches the end of the step's tokens; prompt logprobs
        are added; a sampled token is appended (with speculation: the accepted
        draft and the model's own next token, the rest of the draft's KV
        truncated), the grammar advanced and the finish checked, then
        jump-forward may append forced tokens; a prefill chunk is shared with the
        prefix cache. Then finished requests release their memory.
        """
        row = 0
        for i, item in enumerate(plan.items):
            req = item.req
            self.kv.advance(req, item.prefix_len + item.extend_len)
            req.num_forward_steps += 1
            prompt_lps = result.prompt_logprobs[i]
            if prompt_lps is not None:
                req.add_input_logprobs(prompt_lps.token_logprobs, prompt_lps.top_logprobs)
            if result.embeddings is not None and item.num_sample_rows:
                req.embedding = result.embeddings[i]
            if result.hidden_states is not None and result.hidden_states[i] is not None:
                req.add_hidden_states(item.prefix_len, result.hidden_states[i] or [])
            if item.num_sample_rows and not req.finished:
                self.acceptor.accept(req, result, row, item.draft_ids)
            elif item.draft_ids:  # aborted while its draft was verified
                self.kv.truncate(req, min(req.kv_len, req.num_tokens - 1))
            row += item.num_sample_rows
            if (item.extend_len > 1 and item.prefix_len < req.num_prompt_tokens
                    and not req.finished):
                self.kv.cache_unfinished(req)
                self.groups.on_prefill_progress(req)
        self._release_finished()
        self.num_steps += 1
        self.new_token_ratio.step()

    def _log_batch(self, items: list[ScheduledReq], num_running: int) -> None:
        """The step's SGLang-style log lines (batch_log.py); `num_running`: before admission."""
        used = self.kv.kv_pool.size - self.kv.num_available_slots()
        total = self.kv.kv_pool.size
        admitted = items[len(items) - (len(self.running) - num_running):]
        if any(it.prefix_len < it.req.num_prompt_tokens for it in items):
            self.batch_log.prefill(items, admitted, num_running, len(self.waiting), used, total)
        if any(it.extend_len == 1 and it.prefix_len >= it.req.num_prompt_tokens for it in items):
            out = self.output
            prompt = out.num_prompt_tokens_total
            hit_rate = out.num_cached_tokens_total / prompt if prompt else 0.0
            self.batch_log.decode(len(self.running), len(self.waiting), used, total,
                                  out.num_generation_tokens_total, hit_rate)

    # ------------------------------------------------------------------ finishing

    def _release_finished(self) -> None:
        still: list[Req] = []
        for req in self.running:
            if req.finished:
                self.kv.release(req)
                self.output.pending_finished.append(req)
                self.released_rids.append(req.rid)
            else:
                still.append(req)
        self.running = still

    def check_integrity(self) -> None:
        """Assert the KV accounting identity and the pools' and cache's own checks."""
        self.kv.check_integrity(self.running)

    def close(self) -> None:
        """Before the process exits: let the disk tier finish its queued writes."""
        self.kv.close()


def _step_kind(plan: StepPlan) -> str:
    """extend (prompt chunks, jump-forward or draft runs only), decode (one token each) or
    mixed, as SGLang's forward modes name them."""
    decodes = sum(1 for it in plan.items if it.extend_len == 1)
    if decodes == len(plan.items):
        return "decode"
    return "mixed" if decodes else "extend"
