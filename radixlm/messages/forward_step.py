"""The one-way contract between the scheduler and the model runner.

The scheduler describes each forward pass as a `ForwardStep` of plain values;
the runner answers with a `StepResult`. Nothing else passes between them per
step: the runner never sees the scheduler's request objects, and this module
(like the whole of model_executor) imports nothing from the scheduler package.

A step is a list of items, one per request, each extending its sequence by
`len(input_ids)` tokens after `prefix_len` tokens whose KV is in the pool (1
for a decode, a chunk for a prefill, more after a jump-forward). Tokens are
flattened item by item; item i's KV slots are
`out_cache_loc[start_i : start_i + len(input_ids_i)]`, already written to its
row `req_pool_idx` of the req_to_token table by the scheduler's KVManager
(the table's only writer).

Sampling rows. The last `num_sample_rows` tokens of an item produce logits
that are sampled (0: a prompt chunk that does not reach the end of its
sequence; 1: the next token). The result lists one entry per sampled row, in
step order, so that an item verifying K drafted tokens (speculative decoding)
can ask for 1 + K rows without a new type. Grammar masks come as one packed
bitmask for all sampled rows, filled by the scheduler, which owns the
grammar objects.

Pickling. A step holds ints, lists, `SamplingParams`, one int64 tensor of
slots and, where a step needs them, the multimodal items its tokens cover and
a grammar bitmask: a decoding item pickles to about 230 bytes. This is what
tensor parallelism broadcasts from rank 0 each step; the other ranks need
everything but `sampling` and `vocab_mask` (rank 0 samples), and the
req_to_token rows, whose one writer is the scheduler's KVManager. The
per-request state the runner keeps between steps (a seeded request's RNG)
is keyed by `rid` and dropped when the id appears in `released_rids`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from radixlm.messages.io_struct import LogprobEntry, PoolingParams
from radixlm.messages.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch

    from radixlm.messages.mm_inputs import MultimodalInputs


@dataclass
class SamplingSpec:
    """How an item's sampled rows are sampled and what is reported about them."""

    params: SamplingParams  # as the sampler must apply them (a grammar's request has min_new_tokens 0)
    num_output_tokens: int  # tokens the request generated before this step
    # The request's output so far, only where the sampler reads it (penalties, or
    # min_new_tokens not yet reached); None otherwise, so a step stays small.
    output_ids: list[int] | None = None
    seed: int | None = None  # the request's own RNG (kept by the runner under `rid`); None: global
    return_logprob: bool = False
    top_logprobs_num: int = 0


@dataclass
class PromptLogprobSpec:
    """Prompt logprobs over this step's positions [start, start + len(target_ids)).

    The logits at position p score the prompt token at p + 1: `target_ids[p - start]`.
    """

    start: int
    target_ids: list[int]
    top_logprobs_num: int = 0


@dataclass
class StepItem:
    """One request's share of a forward pass."""

    rid: str
    req_pool_idx: int  # its row of the req_to_token table
    prefix_len: int  # tokens with KV before this step; positions start here
    input_ids: list[int]  # the tokens computed this step
    num_sample_rows: int = 0  # trailing rows whose logits are sampled (see the module doc)
    sampling: SamplingSpec | None = None  # set when num_sample_rows > 0
    prompt_logprobs: PromptLogprobSpec | None = None
    # The request's images / videos when this step's tokens cover one of them.
    mm_inputs: MultimodalInputs | None = None
    # A pooling model's request: what its vector (or label logits) is made of.
    pooling: PoolingParams | None = None
    return_hidden_states: bool = False  # report the final hidden state of every token

    @property
    def extend_len(self) -> int:
        return len(self.input_ids)

    @property
    def positions(self) -> range:
        return range(self.prefix_len, self.prefix_len + len(self.input_ids))


@dataclass
class VocabMask:
    """Grammar masks of the step's sampled rows: bit j of word i of a row set when token
    32 * i + j is allowed (see constrained/base_grammar_backend.py)."""

    bitmask: torch.Tensor  # [num_sample_rows, ceil(V/32)] int32, all ones for free rows
    rows: list[int]  # sampled rows (in step order) that a grammar constrains


@dataclass
class ForwardStep:
    items: list[StepItem]
    out_cache_loc: torch.Tensor  # [sum(extend_len)] int64 KV slots, in the items' order
    vocab_mask: VocabMask | None = None
    released_rids: list[str] = field(default_factory=list)  # finished since the last step

    @property
    def num_tokens(self) -> int:
        return sum(len(item.input_ids) for item in self.items)

    @property
    def num_sample_rows(self) -> int:
        return sum(item.num_sample_rows for item in self.items)


# Per prompt position of a PromptLogprobSpec: its logprob (None at an image's pad
# tokens) and its top list.
class PromptLogprobs(NamedTuple):
    token_logprobs: list[LogprobEntry | None]
    top_logprobs: list[list[LogprobEntry]]


class StepResult(NamedTuple):
    """What the runner returns for a ForwardStep."""

    # One per sampled row, in step order; None where the row's logits had no valid
    # distribution (NaN, every token masked): that request then fails.
    next_token_ids: list[int | None]
    token_logprobs: list[LogprobEntry | None]  # per sampled row; None unless asked
    top_logprobs: list[list[LogprobEntry] | None]  # per sampled row; None unless asked
    prompt_logprobs: list[PromptLogprobs | None]  # per item
    # A pooling model's step, per item: the vector of an item that completed its
    # prompt (its sampled row), else None; None for a generating model.
    embeddings: list[list[float] | None] | None = None
    # Per item that set return_hidden_states: the model's final (normed) hidden state of
    # each of its tokens this step, as float lists [extend_len][hidden]; None for the
    # others, and None altogether when no item asked.
    hidden_states: list[list[list[float]] | None] | None = None
