"""The scheduler's drafter: which requests draft, and which tokens they propose.

`--speculative-algorithm NGRAM` (prompt lookup). Each step, after every
decoding request got its token, a request that may draft proposes up to
`--speculative-num-draft-tokens` K tokens: what followed the latest earlier
occurrence of its last n tokens in its own prompt and output (`NgramIndex`,
updated incrementally). The step then computes its 1 + K tokens and samples
every row; the scheduler keeps the longest prefix of the draft the model
agrees with plus the model's own next token, and truncates the KV of the rest
(`TokenAcceptor.accept`, scheduler/acceptance.py).

Exactness. Only greedy requests draft: a greedy row's argmax depends on the
tokens before it alone, so verified output is token for token what decoding
one token per step gives. Sampled requests (temperature > 0) never draft, and
neither do requests whose sampler reads the output so far (penalties, a
min_new_tokens not yet reached) or that carry a logit_bias: their rows would
need the output up to each row. A constrained request drafts only what its
grammar accepts: the draft is run through the grammar first and cut before the
first token it rejects, before a token that would end the grammar, and after a
token from which the grammar forces text (jump-forward takes over there).

Adaptive rule. A request whose recent acceptance (an exponential average of
accepted / drafted per verify) falls below `--speculative-min-acceptance-rate`
stops drafting for a while (16 output tokens, doubling each time up to 512),
so a workload without repetition pays a few wasted rows, then nothing. And no
request drafts in a step with more decoding requests than
`--speculative-disable-by-batch-size`: a large batch is bound by compute, and
drafted rows then cost as much as the tokens they might save.
"""

from __future__ import annotations

from radixlm.scheduler.request import Req
from radixlm.server_args import ServerArgs
from radixlm.speculative.ngram_index import NgramIndex
from radixlm.speculative.spec_state import INITIAL_BACKOFF, SpecState

MAX_BACKOFF = 512
EMA_WEIGHT = 0.5  # weight of the newest verify in the acceptance average


class NgramDrafter:
    def __init__(self, args: ServerArgs, vocab_size: int, context_len: int,
                 jump_forward: bool) -> None:
        self.num_draft_tokens = args.speculative_num_draft_tokens
        self.min_n = args.speculative_ngram_min_match_window_size
        self.max_n = args.speculative_ngram_max_match_window_size
        self.max_batch_size = args.speculative_disable_by_batch_size
        self.min_acceptance = args.speculative_min_acceptance_rate
        self.vocab_size = vocab_size
        self.jump_forward = jump_forward
        self.context_len = context_len
        self.num_verify_steps = 0
        self.num_draft_tokens_total = 0
        self.num_accepted_tokens_total = 0

    def allows_batch(self, num_decodes: int) -> bool:
        """Whether a step with `num_decodes` decoding requests drafts at all."""
        return 0 < num_decodes <= self.max_batch_size

    @staticmethod
    def may_draft(req: Req) -> bool:
        """Whether verifying drafts leaves `req`'s output exactly as decoding would."""
        params = req.sampling_params
        return (
            params.is_greedy
            and not params.has_penalties
            and not params.logit_bias
            # A rejected draft's rows would leave hidden states of tokens never output.
            and not req.return_hidden_states
            and (req.grammar_key is not None or req.num_output_tokens >= params.min_new_tokens)
            and req.num_pending_tokens == 1
        )

    def propose(self, req: Req, max_len: int) -> list[int]:
        """Up to `max_len` drafted tokens for `req`'s next positions ([] for none)."""
        # Every row may append a token: stay within max_new_tokens and the context.
        max_len = min(max_len, self.num_draft_tokens, req.remaining_new_tokens - 1,
                      self.context_len - req.num_tokens - 1)
        if max_len <= 0 or not self.may_draft(req):
            return []
        state = req.spec_state
        if state is None:
            index = NgramIndex(self.min_n, self.max_n)
            state = req.spec_state = SpecState(index, acceptance=2 * self.min_acceptance)
        if req.num_output_tokens < state.resume_at:
            return []
        state.index.update(req.token_ids)
        draft = state.index.draft(req.token_ids, max_len)
        for i, token_id in enumerate(draft):
            if token_id >= self.vocab_size:  # an image's pad id, never a text token
                draft = draft[:i]
                break
        if draft and req.grammar is not None:
            draft = self._cut_to_grammar(req, draft)
        return draft

    def _cut_to_grammar(self, req: Req, draft: list[int]) -> list[int]:
        """The part of `draft` the grammar can verify row by row (see the module doc);
        leaves the grammar as it was."""
        from radixlm.constrained.base_grammar_backend import GrammarError

        grammar = req.grammar
        assert grammar is not None
        num_kept = 0
        for token_id in draft:
            try:
                grammar.accept_token(token_id)
            except GrammarError:
                break
            if grammar.is_terminated():
                grammar.rollback(1)  # its row would have nothing left to sample
                break
            num_kept += 1
            if self.jump_forward:
                forced = grammar.try_jump_forward()
                if forced is not None and len(forced) > 1:
                    break
        grammar.rollback(num_kept)
        return draft[:num_kept]

    def on_verified(self, req: Req, num_drafted: int, num_accepted: int) -> None:
        """Record a verify of `num_drafted` tokens of which `num_accepted` were kept."""
        state = req.spec_state
        assert state is not None and num_drafted > 0
        req.num_spec_verify_steps += 1
        req.num_spec_draft_tokens += num_drafted
        req.num_spec_accepted_tokens += num_accepted
        self.num_verify_steps += 1
        self.num_draft_tokens_total += num_drafted
        self.num_accepted_tokens_total += num_accepted
        rate = num_accepted / num_drafted
        state.acceptance = (1 - EMA_WEIGHT) * state.acceptance + EMA_WEIGHT * rate
        if state.acceptance < self.min_acceptance:
            state.resume_at = req.num_output_tokens + state.backoff
            state.backoff = min(2 * state.backoff, MAX_BACKOFF)
            state.acceptance = 2 * self.min_acceptance  # a fresh start after the pause
        elif rate >= 0.5:
            state.backoff = INITIAL_BACKOFF

    @staticmethod
    def on_rewrite(req: Req, num_tokens: int) -> None:
        """`req`'s tokens from `num_tokens` on were replaced (jump-forward)."""
        if req.spec_state is not None:
            req.spec_state.index.rewind(num_tokens)

    def stats(self) -> dict[str, float]:
        drafted = self.num_draft_tokens_total
        return {
            "spec_num_verify_steps": self.num_verify_steps,
            "spec_num_draft_tokens": drafted,
            "spec_num_accepted_tokens": self.num_accepted_tokens_total,
            "spec_accept_rate": round(self.num_accepted_tokens_total / drafted, 4) if drafted else 0.0,
        }
