"""Accepting a step's sampled tokens: what a request keeps of its rows after a forward pass.

For each request that sampled, `TokenAcceptor.accept` appends the sampled
token, feeds it to the request's grammar and checks whether the request
finished (output_processor.py); then jump-forward may append the text the
grammar forces (jump_forward.py). With a speculative draft, the step sampled
one row per drafted token: tokens are kept while the model agrees with the
draft, each through exactly the checks decoding it alone would get, and the
KV of the drafted tokens not kept is truncated. `Scheduler._process` calls it
item by item; nothing else changes a request's output after a step.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from radixlm.messages.forward_step import StepResult
from radixlm.messages.io_struct import FinishReason
from radixlm.scheduler.jump_forward import JumpForward, JumpPlan, swap_tokens
from radixlm.scheduler.kv_manager import KVManager
from radixlm.scheduler.output_processor import OutputProcessor
from radixlm.scheduler.request import Req

if TYPE_CHECKING:
    from radixlm.scheduler.ngram_drafter import NgramDrafter

logger = logging.getLogger("radixlm.scheduler.scheduler")  # log lines keep the scheduler's name


class TokenAcceptor:
    def __init__(self, kv: KVManager, output: OutputProcessor, jump_forward: JumpForward | None,
                 drafter: NgramDrafter | None) -> None:
        """jump_forward: None without jump-forward; drafter: None without speculation."""
        self.kv = kv
        self.output = output
        self.jump_forward = jump_forward
        self.drafter = drafter

    def accept(self, req: Req, result: StepResult, row: int, draft_ids: list[int]) -> None:
        """The tokens sampled for `req` from `row` on: append each, checking grammar and
        finish, then jump forward over what the grammar forces.

        With a draft, row i verifies draft_ids[i]: tokens are appended while the
        model's choice equals the draft, and the first differing choice (or the
        row after a fully accepted draft) is the model's own next token. Each
        token goes through exactly the checks decoding it alone would (a finish
        or a forced jump ends the acceptance there); then the KV of the drafted
        tokens not kept is truncated.
        """
        req.input_logprobs_done = True
        if req.sampling_params.max_new_tokens == 0:
            req.finished_reason = FinishReason("length")
            return
        jump: JumpPlan | None = None
        num_accepted = 0
        for i in range(len(draft_ids) + 1):
            token_id = result.next_token_ids[row + i]
            if token_id is None:
                self._fail_invalid_logits(req)
                break
            req.append_output(token_id, result.token_logprobs[row + i],
                              result.top_logprobs[row + i])
            self.output.num_generation_tokens_total += 1
            req.finished_reason = self._accept_grammar(req, token_id) or (
                self.output.check_finished(req, token_id))
            matched = i < len(draft_ids) and token_id == draft_ids[i]
            num_accepted += matched
            if req.finished or not matched:
                break
            jump = self._plan_jump(req)  # decoding alone would jump here too
            if jump is not None:
                break
        if draft_ids:
            # The KV of an appended token is computed by the next step, as for a decode.
            self.kv.truncate(req, min(req.kv_len, req.num_tokens - 1))
            assert self.drafter is not None
            self.drafter.on_verified(req, len(draft_ids), num_accepted)
        if jump is None:
            jump = self._plan_jump(req)
        if jump is not None:
            self._apply_jump(req, jump)

    def _fail_invalid_logits(self, req: Req) -> None:
        logger.error("Request %s: its logits had no valid distribution (NaN or "
                     "every token masked); it fails", req.rid)
        req.finished_reason = FinishReason(
            "abort", message="The model produced no valid next-token distribution "
            "(NaN or infinite logits) for this request", status_code=500)

    def _plan_jump(self, req: Req) -> JumpPlan | None:
        if req.grammar is None or self.jump_forward is None or req.finished:
            return None
        return self.jump_forward.plan(req)

    def _accept_grammar(self, req: Req, token_id: int) -> FinishReason | None:
        """Feed the sampled token to the request's grammar; a terminated grammar stops it."""
        if req.grammar is None:
            return None
        from radixlm.constrained.base_grammar_backend import GrammarError

        try:
            req.grammar.accept_token(token_id)
        except GrammarError as e:  # the mask allowed it, so this is a backend bug
            logger.error("Grammar of %s rejected sampled token %d: %s", req.rid, token_id, e)
            req.drop_last_output()  # never show output that breaks the grammar
            return FinishReason("abort", message=f"Internal grammar error: {e}", status_code=500)
        if req.grammar.is_terminated():
            return FinishReason("stop", matched=token_id)
        return None

    def _apply_jump(self, req: Req, jump: JumpPlan) -> None:
        """Replace req's output tail by the jump's tokens; the next step extends over them."""
        assert req.grammar is not None
        if not swap_tokens(req.grammar, req.output_tail(jump.num_keep), jump.new_ids):
            return
        self.kv.truncate(req, min(req.kv_len, req.num_prompt_tokens + jump.num_keep))
        del req.hidden_states[max(req.kv_len, req.num_sent_hidden_states):]
        req.replace_output_tail(jump.num_keep, jump.new_ids)
        if self.drafter is not None:
            self.drafter.on_rewrite(req, req.num_prompt_tokens + jump.num_keep)
        req.finished_reason = self.output.check_length_and_stop_strings(req, len(jump.new_ids))
