"""The scheduler's plan of one step: which request computes which of its tokens.

`schedule()` builds a `StepPlan`; `to_forward_step()` turns it into the
runner's plain `ForwardStep` (messages/forward_step.py), item for item, and
`Scheduler._process` applies the runner's `StepResult` back to the plan's
requests. The plan keeps the request objects; the ForwardStep never does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from radixlm.messages.forward_step import (
    ForwardStep,
    PromptLogprobSpec,
    SamplingSpec,
    StepItem,
    VocabMask,
)
from radixlm.scheduler.request import Req


@dataclass
class ScheduledReq:
    """One request's share of a step: its tokens [prefix_len, prefix_len + extend_len)."""

    req: Req
    prefix_len: int  # kv_len before the step
    extend_len: int  # tokens computed this step, drafted ones included
    num_sample_rows: int  # 1 when the step reaches the end of the token list (+ drafts), else 0
    # Prompt positions [a, b) whose logits are needed for prompt logprobs.
    logprob_positions: tuple[int, int] | None = None
    # Speculative decoding: tokens drafted after the token list's end, each verified by
    # its own sampled row (the row before it predicts it).
    draft_ids: list[int] = dataclasses.field(default_factory=list)

    @classmethod
    def plan(cls, req: Req, extend_len: int) -> ScheduledReq:
        """The share that computes the next `extend_len` pending tokens of `req`."""
        prefix_len = req.kv_len
        samples = prefix_len + extend_len == req.num_tokens
        positions = None
        if req.wants_input_logprobs:
            assert req.logprob_start_len is not None
            # Logits at position p score prompt token p + 1.
            first = max(req.logprob_start_len - 1, 0)
            last = req.num_prompt_tokens - 1  # exclusive of the sampling position
            lo, hi = max(first, prefix_len), min(last, prefix_len + extend_len)
            if lo < hi:
                positions = (lo, hi)
        return cls(req, prefix_len, extend_len, int(samples), positions)

    def add_draft(self, draft_ids: list[int]) -> None:
        """Verify `draft_ids` after this decode's token: 1 + K tokens, 1 + K sampled rows."""
        assert self.num_sample_rows == 1 and not self.draft_ids
        self.draft_ids = draft_ids
        self.extend_len += len(draft_ids)
        self.num_sample_rows += len(draft_ids)

    def to_step_item(self) -> StepItem:
        req = self.req
        end = self.prefix_len + self.extend_len - len(self.draft_ids)  # end of req.token_ids
        prompt_lps = None
        if self.logprob_positions is not None:
            lo, hi = self.logprob_positions
            prompt_lps = PromptLogprobSpec(lo, req.token_ids[lo + 1 : hi + 1],
                                           req.top_logprobs_num)
        mm = req.mm_inputs
        if mm is not None and not mm.overlapping(self.prefix_len, end):
            mm = None  # the model writes features only where the step covers an item
        assert req.req_pool_idx is not None
        return StepItem(
            rid=req.rid,
            req_pool_idx=req.req_pool_idx,
            prefix_len=self.prefix_len,
            input_ids=req.token_ids[self.prefix_len : end] + self.draft_ids,
            num_sample_rows=self.num_sample_rows,
            sampling=_sampling_spec(req) if self.num_sample_rows else None,
            prompt_logprobs=prompt_lps,
            mm_inputs=mm,
            pooling=req.pooling,
            return_hidden_states=req.return_hidden_states,
        )


def _sampling_spec(req: Req) -> SamplingSpec:
    params = req.sampling_params
    if req.grammar_key is not None and params.min_new_tokens > 0:
        # A grammar decides where the output may end: min_new_tokens must not ban
        # the EOS it requires. (A thinking budget alone is no such grammar.)
        params = dataclasses.replace(params, min_new_tokens=0)
    num_output = req.num_output_tokens
    needs_output = params.has_penalties or num_output < params.min_new_tokens
    return SamplingSpec(
        params=params,
        num_output_tokens=num_output,
        output_ids=req.output_ids if needs_output else None,
        seed=req.seed,
        return_logprob=req.return_logprob,
        top_logprobs_num=req.top_logprobs_num,
    )


@dataclass
class StepPlan:
    items: list[ScheduledReq]
    out_cache_loc: torch.Tensor  # [sum(extend_len)] int64, slots already written to req_to_token

    @property
    def num_tokens(self) -> int:
        return int(self.out_cache_loc.numel())

    def to_forward_step(self, vocab_mask: VocabMask | None,
                        released_rids: list[str]) -> ForwardStep:
        return ForwardStep([item.to_step_item() for item in self.items], self.out_cache_loc,
                           vocab_mask, released_rids)
