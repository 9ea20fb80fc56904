"""The interface every causal language model implements (what the model runner calls)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from radixlm.models.pooler import PoolingConfig

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
    # False for models that answer a prompt with a vector (PoolingModel).
    is_generation: ClassVar[bool] = True

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

    def set_context_length(self, context_len: int) -> None:
        """The longest sequence this model will serve (the runner calls it once after
        loading; LongRoPE picks its factors by it). Nothing to do for most models."""


class PoolingModel(CausalLM):
    """A model that answers each prompt with one vector instead of generating.

    Embedding models return the pooled hidden state (`num_labels == 0`);
    classifiers return one logit per label. `pooling` is set by the loader
    from the checkpoint folder (see models/pooler.py). `is_causal` False means
    attention is bidirectional: a prompt is computed in one step from
    position 0 and never shares the prefix cache.
    """

    is_generation: ClassVar[bool] = False
    is_causal: ClassVar[bool] = True
    default_pooling: ClassVar[PoolingConfig] = PoolingConfig("last", normalize=True)

    def __init__(self, config: Any, dtype: torch.dtype | None = None) -> None:
        super().__init__(config, dtype)
        self.pooling: PoolingConfig = self.default_pooling

    @property
    def num_labels(self) -> int:
        """Number of classifier outputs; 0 for an embedding model."""
        return 0

    @property
    def needs_whole_prompt(self) -> bool:
        """True when a prompt must be computed in one step from position 0."""
        return not self.is_causal or self.pooling.needs_whole_prompt

    def pool_forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        """input_ids, positions [T] → one float32 row per request [B, D]: the pooled
        vector (unnormalized) or the label logits. Rows of requests whose prompt is not
        complete in this step are meaningless (their KV is still written)."""
        raise NotImplementedError

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise TypeError(f"{type(self).__name__} does not generate")
