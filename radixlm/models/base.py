"""The interface every causal language model implements (what the model runner calls)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

if TYPE_CHECKING:
    from radixlm.model_executor.forward_batch import ForwardBatch


class CausalLM(nn.Module):
    """A decoder LM that keeps Hugging Face weight names.

    Built as `cls(config, dtype)` with uninitialized weights, then filled by
    `load_weights`. Attention goes through `forward_batch.attn_backend`, which
    also writes this step's K/V into the pool.
    """

    # True for models that take images (models/llava.py); the pipeline rejects
    # image input for the others.
    has_vision: ClassVar[bool] = False

    def __init__(self, config: Any, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.config = config

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        forward_batch: ForwardBatch,
        input_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, positions [T] → hidden states [T, hidden] (final norm applied).

        input_embeds [T, hidden], when given, replaces the token embedding lookup
        (a multimodal model passes text embeddings with image features written in).
        """
        raise NotImplementedError

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [T] (each < vocab_size) → token embeddings [T, hidden]."""
        raise NotImplementedError

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [M, hidden] → float32 logits [M, vocab_size]."""
        raise NotImplementedError

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy (Hugging Face name, tensor) pairs into the parameters."""
        raise NotImplementedError
