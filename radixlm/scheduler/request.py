"""A request as the scheduler sees it, and the plain description of one step.

A `Req` holds its whole token list (`fill_ids` = prompt + output) and `kv_len`,
how many of those tokens already have KV in the pool. Rows `[0, cached_len)` of
its req_to_token row belong to the prefix cache (locked through `last_node`);
rows `[cached_len, kv_len)` are the request's own slots. Catching up with the
token list is all a step ever does: a decode extends by one token, a prefill by
a chunk, a resumed request by everything it lost when it was retracted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from radixlm.io_struct import FinishReason, LogprobEntry, TokenizedGenerateReq
from radixlm.multimodal.mm_inputs import MultimodalInputs
from radixlm.sampling.sampling_params import SamplingParams

if TYPE_CHECKING:
    from radixlm.constrained.base_grammar_backend import BaseGrammarObject


class Req:
    def __init__(self, tokenized: TokenizedGenerateReq, arrival_seq: int) -> None:
        self.rid = tokenized.rid
        self.origin_input_ids: list[int] = list(tokenized.input_ids)
        self.output_ids: list[int] = []
        self.sampling_params: SamplingParams = tokenized.sampling_params
        self.return_logprob = tokenized.return_logprob
        self.logprob_start_len = tokenized.logprob_start_len
        self.top_logprobs_num = tokenized.top_logprobs_num
        self.stream = tokenized.stream
        self.group_id = tokenized.group_id
        self.mm_inputs: MultimodalInputs | None = tokenized.mm_inputs
        self.arrival_seq = arrival_seq
        self.arrival_time = time.monotonic()
        self.generator: torch.Generator | None = None
        if tokenized.seed is not None:
            self.generator = torch.Generator().manual_seed(tokenized.seed)

        # Constrained decoding: the grammar object exists once compiled (GrammarManager).
        self.grammar_key: tuple[str, str] | None = self.sampling_params.grammar
        self.grammar: BaseGrammarObject | None = None

        # Memory state (see the module docstring).
        self.req_pool_idx: int | None = None
        self.kv_len = 0
        self.cached_len = 0
        self.last_node: Any = None
        self.admit_seq = -1  # order of the latest admission; retraction takes the newest

        # Reporting.
        self.num_cached_tokens: int | None = None  # prefix hit at first admission
        self.finished_reason: FinishReason | None = None
        self.num_sent_tokens = 0
        self.num_steps_since_send = 0
        self.num_retractions = 0
        self.num_forward_steps = 0  # forward passes this request took part in
        self.num_jump_forward_tokens = 0  # output tokens appended by jump-forward, net

        # Logprobs, accumulated here and sent as deltas.
        self.output_token_logprobs: list[LogprobEntry] = []
        self.output_top_logprobs: list[list[LogprobEntry]] = []
        self.input_token_logprobs: list[LogprobEntry | None] | None = None
        self.input_top_logprobs: list[list[LogprobEntry] | None] | None = None
        self.input_logprobs_done = False  # set once the whole prompt has been prefilled
        self.input_logprobs_sent = False
        if self.wants_input_logprobs:
            # Prompt position p is scored by the logits at p - 1; position 0 has none.
            first = [None] if self.logprob_start_len == 0 else []
            self.input_token_logprobs = list(first)
            self.input_top_logprobs = list(first)

    # ------------------------------------------------------------------ derived

    @property
    def fill_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    @property
    def num_fill_tokens(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def num_pending_tokens(self) -> int:
        """Tokens whose KV this request still has to compute."""
        return self.num_fill_tokens - self.kv_len

    @property
    def num_own_slots(self) -> int:
        """KV slots this request holds that the prefix cache does not own."""
        return self.kv_len - self.cached_len

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None

    @property
    def wants_input_logprobs(self) -> bool:
        return (
            self.return_logprob
            and self.logprob_start_len >= 0
            and self.logprob_start_len < len(self.origin_input_ids)
            and not self.input_logprobs_done
        )

    @property
    def max_prefix_len(self) -> int:
        """How much of the prompt a prefix-cache hit may cover.

        The last prompt token is always recomputed (its logits start the
        output); with prompt logprobs, the logits from `logprob_start_len - 1`
        on are needed, so the hit stops there.
        """
        limit = self.num_fill_tokens - 1
        if self.wants_input_logprobs:
            limit = min(limit, max(self.logprob_start_len - 1, 0))
        return max(limit, 0)

    @property
    def remaining_new_tokens(self) -> int:
        return max(self.sampling_params.max_new_tokens - len(self.output_ids), 0)

    def reset_memory_state(self) -> None:
        """Forget KV bookkeeping after the KVManager released this request."""
        self.req_pool_idx = None
        self.kv_len = 0
        self.cached_len = 0
        self.last_node = None

    def reset_for_retraction(self) -> None:
        self.reset_memory_state()
        self.num_retractions += 1


@dataclass
class ScheduledReq:
    """One request's share of a step."""

    req: Req
    prefix_len: int  # kv_len before the step
    extend_len: int  # tokens computed this step
    samples: bool  # the step reaches the end of fill_ids: sample the next token
    # Prompt positions [a, b) whose logits are needed for prompt logprobs.
    logprob_positions: tuple[int, int] | None = None

    @property
    def input_ids(self) -> list[int]:
        """fill_ids[prefix_len : prefix_len + extend_len], without building fill_ids.

        NOTE: runs for every request every step; concatenating prompt and output
        first would cost time proportional to the sequence length.
        """
        req, start, end = self.req, self.prefix_len, self.prefix_len + self.extend_len
        num_prompt = len(req.origin_input_ids)
        if start >= num_prompt:
            return req.output_ids[start - num_prompt : end - num_prompt]
        if end <= num_prompt:
            return req.origin_input_ids[start:end]
        return req.origin_input_ids[start:] + req.output_ids[: end - num_prompt]


@dataclass
class StepPlan:
    """Everything the model runner needs for one forward pass, as CPU objects."""

    items: list[ScheduledReq]
    out_cache_loc: torch.Tensor  # [sum(extend_len)] int64, slots already written to req_to_token

    @property
    def num_tokens(self) -> int:
        return int(self.out_cache_loc.numel())


# Per prompt position: its logprob (None at an image's pad tokens), and its top list.
InputLogprobs = tuple[list[LogprobEntry | None], list[list[LogprobEntry]]]


class ForwardResult(NamedTuple):
    """What the runner returns for a step, per plan item (same order as `StepPlan.items`)."""

    # None where the item does not sample, or where its logits had no valid
    # distribution (NaN, every token masked): that request then fails.
    next_token_ids: list[int | None]
    token_logprobs: list[LogprobEntry | None]
    top_logprobs: list[list[LogprobEntry] | None]
    input_logprobs: list[InputLogprobs | None]
