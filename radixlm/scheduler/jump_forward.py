"""Jump-forward decoding: append the text a grammar forces, without sampling it.

After a constrained request accepts a token, its grammar may know the next
characters for certain (`{"name": "` after `{` in a fixed-key schema). Those
tokens need no sampling: they are appended to the request, and the one-budget
scheduler computes their KV as an extend in the next step, inside the running
batch. One forward pass then covers what would have taken one per token.

Token boundaries are the subtle part. The forced text is not retokenized on
its own: the last few output tokens are decoded, the forced text appended,
and the whole retokenized, so that `"` sampled just before `name"` can merge
into `"name` as the tokenizer would write it. The tokens shared with the old
tail stay; the differing old tail is rolled back (grammar rollback, KV slots
freed) and the new tokens are appended.

Only tokens that are not yet sent to the detokenizer and whose KV is not in
the prefix cache may be replaced, so streams and the radix tree never see a
token change. A retokenization that would change the text (a multi-byte
character cut in two, a leading-space rule of the tokenizer) is abandoned:
the request then just samples its next token as usual.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from radixlm.scheduler.request import Req

if TYPE_CHECKING:
    from radixlm.constrained.base_grammar_backend import BaseGrammarObject
    from radixlm.tokenizer_utils import TokenDecoder

MAX_RETOKENIZE_TOKENS = 8  # how far back the tail may be retokenized
NUM_CONTEXT_TOKENS = 4  # tokens before the tail decoded to check the text is unchanged


class JumpPlan(NamedTuple):
    num_keep: int  # output tokens kept: output_ids[:num_keep]
    new_ids: list[int]  # appended after them (the forced text's tokens, and a retokenized tail)


def plan_jump(
    output_ids: list[int], first_replaceable: int, forced_text: str, tokenizer: TokenDecoder
) -> JumpPlan | None:
    """How to append `forced_text` to `output_ids`, replacing only tokens from
    `first_replaceable` on; None when no retokenization keeps the text exact."""
    if _decode(tokenizer, output_ids[-NUM_CONTEXT_TOKENS:]).endswith("\ufffd"):
        return None  # the output ends inside a character: the grammar is mid-character too
    start = max(first_replaceable, len(output_ids) - MAX_RETOKENIZE_TOKENS, 0)
    for tail_start in range(start, len(output_ids) + 1):
        tail = output_ids[tail_start:]
        tail_text = _decode(tokenizer, tail)
        if "\ufffd" in tail_text:  # the tail starts or ends inside a character
            continue
        new_ids = list(tokenizer.encode(tail_text + forced_text, add_special_tokens=False))
        num_common = _common_prefix_len(tail, new_ids)
        if num_common == len(new_ids):
            return None
        context = output_ids[max(tail_start - NUM_CONTEXT_TOKENS, 0) : tail_start]
        expected = _decode(tokenizer, context + tail) + forced_text
        if _decode(tokenizer, context + new_ids) != expected:
            continue
        return JumpPlan(tail_start + num_common, new_ids[num_common:])
    return None


class JumpForward:
    """Plans jump-forward for constrained requests right after they accept a token."""

    def __init__(self, tokenizer: TokenDecoder, context_len: int) -> None:
        self.tokenizer = tokenizer
        self.context_len = context_len

    def plan(self, req: Req) -> JumpPlan | None:
        """How to append the text `req`'s grammar forces (num_keep counts output tokens),
        or None when nothing is forced or no retokenization keeps the text exact.

        Changes nothing: the caller rolls the grammar over with `swap_tokens` and
        then truncates the KV and replaces the output tail.
        """
        grammar = req.grammar
        if grammar is None or req.finished or req.return_logprob:
            return None
        forced = grammar.try_jump_forward()
        if forced is None or len(forced) <= 1:
            return None
        num_output = req.num_output_tokens
        first = max(req.num_sent_tokens, req.cached_len - req.num_prompt_tokens)
        # Only the last few output tokens can change: plan on that window alone.
        window_start = max(max(first, num_output - MAX_RETOKENIZE_TOKENS) - NUM_CONTEXT_TOKENS, 0)
        window = req.output_tail(window_start)
        plan = plan_jump(window, max(first - window_start, 0), forced, self.tokenizer)
        if plan is None:
            return None
        num_keep = window_start + plan.num_keep
        limit = min(req.sampling_params.max_new_tokens,
                    self.context_len - req.num_prompt_tokens)
        new_ids = plan.new_ids[: max(limit - num_keep, 0)]
        return JumpPlan(num_keep, new_ids) if new_ids else None


def swap_tokens(grammar: BaseGrammarObject, old_ids: list[int], new_ids: list[int]) -> bool:
    """Roll `old_ids` back and accept `new_ids`; on a rejection restore the old state
    and return False."""
    from radixlm.constrained.base_grammar_backend import GrammarError

    grammar.rollback(len(old_ids))
    for i, token_id in enumerate(new_ids):
        try:
            grammar.accept_token(token_id)
        except GrammarError:
            grammar.rollback(i)
            for old_id in old_ids:
                grammar.accept_token(old_id)
            return False
    return True


def _decode(tokenizer: TokenDecoder, ids: list[int]) -> str:
    return str(tokenizer.decode(ids, skip_special_tokens=False))


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
