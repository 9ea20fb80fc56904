"""The device-side description of one forward pass.

The scheduler describes a step with plain CPU objects (`ForwardStep`, see
messages/forward_step.py); the model runner turns that into a `ForwardBatch` of
tensors, which the model and the attention backend read. Every request in a batch "extends" its sequence by
`extend_lens[i]` tokens (1 for a decode, a chunk for a prefill, more for a
jump-forward), after `prefix_lens[i]` tokens whose KV is already in the pool.

Tokens are flattened request-major: request i owns rows
`extend_start_loc[i] : extend_start_loc[i] + extend_lens[i]` of `input_ids`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from radixlm.mem_cache.memory_pool import TokenToKVPool
    from radixlm.messages.mm_inputs import MultimodalInputs


class AttentionCall(Protocol):
    """layers/attention.py's AttentionBackend, as far as a model calls it.

    NOTE: a Protocol, not the class: the backends read ForwardBatch, so naming the
    class here would make the two modules import each other."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                forward_batch: ForwardBatch, options: Any = ...) -> torch.Tensor: ...


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64, position of each token in its sequence
    out_cache_loc: torch.Tensor  # [T] int64, KV slot written for each token
    req_pool_indices: torch.Tensor  # [B] int64, rows of req_to_token
    req_to_token: torch.Tensor  # [num_req_slots, max_context_len] int64 (the pool's table)
    token_to_kv_pool: TokenToKVPool
    prefix_lens: list[int]  # [B] tokens already cached before this step
    extend_lens: list[int]  # [B] tokens computed in this step
    # Rows of the flattened tokens whose logits the runner computes, e.g. the
    # last token of each request that samples, plus prompt-logprob positions.
    logits_indices: torch.Tensor | None = None
    # The runner's attention backend; each attention layer calls its forward().
    attn_backend: AttentionCall | None = None
    # Filled by the attention backend's init_forward_metadata(), read by its forward().
    attn_metadata: Any = None
    # [B] each request's images / videos (None for text-only requests); a
    # multimodal model writes the features of the items overlapping this step's
    # extend, rows prefix_lens[i] .. prefix_lens[i] + extend_lens[i] of request i.
    mm_inputs: list[MultimodalInputs | None] | None = None
    # Per item, an encoder's segment ids for a sentence pair (None: all segment 0).
    token_type_ids: list[list[int] | None] | None = None

    @property
    def batch_size(self) -> int:
        return len(self.extend_lens)

    @property
    def seq_lens(self) -> list[int]:
        return [p + e for p, e in zip(self.prefix_lens, self.extend_lens)]

    @property
    def extend_start_loc(self) -> list[int]:
        starts, acc = [], 0
        for n in self.extend_lens:
            starts.append(acc)
            acc += n
        return starts
