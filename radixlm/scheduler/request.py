"""A request as the scheduler sees it.

A `Req` holds one token list, `token_ids`: the prompt (its first
`num_prompt_tokens`) followed by the output so far. The views a step needs
are slices of it, never concatenations: `token_ids[kv_len:]` are the pending
tokens, whose KV is not computed yet. Catching up with the token list is all
a step ever does: a decode extends by one token, a prefill by a chunk, a
resumed request by everything it lost when it was retracted, a jump-forward
by the tokens its grammar forced.

Memory: rows `[0, cached_len)` of its req_to_token row belong to the prefix
cache (locked through `last_node`); rows `[cached_len, kv_len)` are the
request's own slots. The KVManager is the only writer of those fields.
After a forward pass, `Scheduler._process` (with the TokenAcceptor it calls)
is the only place that changes a request (through the methods below and the
KVManager).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from radixlm.messages.io_struct import (
    FinishReason,
    LogprobEntry,
    PoolingParams,
    TokenizedGenerateReq,
)
from radixlm.messages.mm_inputs import MultimodalInputs
from radixlm.messages.sampling_params import SamplingParams

if TYPE_CHECKING:
    from radixlm.constrained.base_grammar_backend import BaseGrammarObject
    from radixlm.mem_cache.disk_tier import DiskLoad
    from radixlm.speculative.spec_state import SpecState


class Req:
    def __init__(self, tokenized: TokenizedGenerateReq, arrival_seq: int) -> None:
        self.rid = tokenized.rid
        self.token_ids: list[int] = list(tokenized.input_ids)  # prompt, then output
        self.num_prompt_tokens = len(self.token_ids)
        self.sampling_params: SamplingParams = tokenized.sampling_params
        self.return_logprob = tokenized.return_logprob
        self.logprob_start_len = tokenized.logprob_start_len  # None: no prompt logprobs
        self.top_logprobs_num = tokenized.top_logprobs_num
        self.stream = tokenized.stream
        self.return_hidden_states = tokenized.return_hidden_states
        # With return_hidden_states: the final hidden state of positions [0, len), one
        # per token whose KV was computed (kept across retraction; cut by a jump).
        self.hidden_states: list[list[float]] = []
        self.num_sent_hidden_states = 0
        self.group_id = tokenized.group_id
        self.mm_inputs: MultimodalInputs | None = tokenized.mm_inputs
        self.seed = tokenized.seed  # the runner keeps the RNG it seeds, under rid
        self.pooling: PoolingParams | None = tokenized.pooling
        self.background = tokenized.background  # Batch API traffic: admitted last
        # Computed in one step from position 0, never from the prefix cache (set by the
        # scheduler for encoders and mean / CLS pooling).
        self.whole_prompt = False
        self.embedding: list[float] | None = None  # a pooling request's answer
        self.arrival_seq = arrival_seq
        self.priority = tokenized.priority  # see policy.PriorityOrder for its direction

        # Constrained decoding: the grammar object exists once compiled (GrammarManager).
        self.grammar_key: tuple[str, str] | None = self.sampling_params.grammar
        self.grammar: BaseGrammarObject | None = None

        # Memory state (see the module docstring).
        self.req_pool_idx: int | None = None
        self.kv_len = 0
        self.cached_len = 0
        self.last_node: Any = None  # the prefix cache's node (see BasePrefixCache)
        self.admit_seq: int | None = None  # order of the latest admission (retraction: newest)
        # Disk tier (kv_disk.py): whether it waits for its prefix to be read, the load it
        # waits for, the chain keys of its prompt's blocks (with the length they cover),
        # the tokens the latest install added to the pool, how far its KV was offered
        # for writing through.
        self.disk_waiting = False
        self.disk_load: DiskLoad | None = None
        self.disk_keys: tuple[int, list[bytes]] | None = None
        self.disk_hit_len = 0
        self.disk_offered_len = 0

        # Reporting.
        self.num_cached_tokens: int | None = None  # prefix hit at first admission
        self.num_cached_tokens_disk: int | None = None  # the part of it read from disk
        self.finished_reason: FinishReason | None = None
        self.num_sent_tokens = 0  # output tokens already sent to the detokenizer
        self.num_steps_since_send = 0
        self.num_retractions = 0
        self.num_forward_steps = 0  # forward passes this request took part in
        self.num_jump_forward_tokens = 0  # output tokens appended by jump-forward, net
        # Speculative decoding: the drafter's state, and what its verifies kept.
        self.spec_state: SpecState | None = None
        self.num_spec_verify_steps = 0  # steps that verified a draft of this request
        self.num_spec_draft_tokens = 0
        self.num_spec_accepted_tokens = 0

        # Logprobs, accumulated here and sent as deltas.
        self.output_token_logprobs: list[LogprobEntry] = []
        self.output_top_logprobs: list[list[LogprobEntry]] = []
        self.input_token_logprobs: list[LogprobEntry | None] | None = None
        self.input_top_logprobs: list[list[LogprobEntry] | None] | None = None
        self.input_logprobs_done = False  # set once the whole prompt has been prefilled
        self.input_logprobs_sent = False
        if self.wants_input_logprobs:
            # Prompt position p is scored by the logits at p - 1; position 0 has none.
            first: list[None] = [None] if self.logprob_start_len == 0 else []
            self.input_token_logprobs = list(first)
            self.input_top_logprobs = list(first)

    # ------------------------------------------------------------------ views

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_ids(self) -> list[int]:
        """A copy of the prompt (O(prompt); the hot paths slice `token_ids` instead)."""
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_ids(self) -> list[int]:
        """A copy of the output so far (O(output); the hot paths slice `token_ids`)."""
        return self.token_ids[self.num_prompt_tokens :]

    def output_tail(self, start: int) -> list[int]:
        """Output tokens from output position `start` on (O(len - start))."""
        return self.token_ids[self.num_prompt_tokens + start :]

    @property
    def num_pending_tokens(self) -> int:
        """Tokens whose KV this request still has to compute."""
        return len(self.token_ids) - self.kv_len

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
            and self.logprob_start_len is not None
            and self.logprob_start_len < self.num_prompt_tokens
            and not self.input_logprobs_done
        )

    @property
    def max_prefix_len(self) -> int:
        """How much of the prompt a prefix-cache hit may cover.

        The last prompt token is always recomputed (its logits start the
        output); with prompt logprobs, the logits from `logprob_start_len - 1`
        on are needed, so the hit stops there; with hidden states, at the first
        position whose hidden state is not recorded yet.
        """
        if self.whole_prompt:
            return 0
        limit = len(self.token_ids) - 1
        if self.wants_input_logprobs:
            assert self.logprob_start_len is not None
            limit = min(limit, max(self.logprob_start_len - 1, 0))
        if self.return_hidden_states:
            limit = min(limit, len(self.hidden_states))  # a cache hit has no hidden states
        return max(limit, 0)

    @property
    def remaining_new_tokens(self) -> int:
        return max(self.sampling_params.max_new_tokens - self.num_output_tokens, 0)

    # ------------------------------------------------------------------ changes

    def append_output(self, token_id: int, logprob: LogprobEntry | None,
                      top_logprobs: list[LogprobEntry] | None) -> None:
        """One sampled token (with its logprobs when the request asked for them)."""
        self.token_ids.append(token_id)
        self.num_steps_since_send += 1
        if self.return_logprob:
            assert logprob is not None, "a request with logprobs needs its token's logprob"
            self.output_token_logprobs.append(logprob)
            self.output_top_logprobs.append(top_logprobs or [])

    def drop_last_output(self) -> None:
        """Undo the last append_output (a token its grammar rejected)."""
        self.token_ids.pop()
        if self.return_logprob:
            self.output_token_logprobs.pop()
            self.output_top_logprobs.pop()

    def replace_output_tail(self, num_keep: int, new_ids: list[int]) -> None:
        """Keep the first `num_keep` output tokens and append `new_ids` (jump-forward)."""
        num_old = self.num_output_tokens - num_keep
        self.token_ids[self.num_prompt_tokens + num_keep :] = new_ids
        self.num_jump_forward_tokens += len(new_ids) - num_old

    def add_input_logprobs(self, token_logprobs: list[LogprobEntry | None],
                           top_logprobs: list[list[LogprobEntry]]) -> None:
        assert self.input_token_logprobs is not None and self.input_top_logprobs is not None
        self.input_token_logprobs.extend(token_logprobs)
        self.input_top_logprobs.extend(top_logprobs)

    def add_hidden_states(self, prefix_len: int, rows: list[list[float]]) -> None:
        """The hidden states of positions [prefix_len, prefix_len + len(rows)); positions
        already recorded (a retracted request recomputing them) are skipped."""
        skip = len(self.hidden_states) - prefix_len
        self.hidden_states.extend(rows[max(skip, 0):])

    def reset_memory_state(self) -> None:
        """Forget KV bookkeeping after the KVManager released this request."""
        self.req_pool_idx = None
        self.kv_len = 0
        self.cached_len = 0
        self.last_node = None

    def reset_for_retraction(self) -> None:
        self.reset_memory_state()
        self.num_retractions += 1
