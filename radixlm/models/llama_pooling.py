"""Llama-family models that pool instead of generating: embeddings and classifiers.

- `LlamaEmbeddingModel` (and its Mistral / Qwen2 variants): the decoder's
  final-normed hidden states, pooled as the checkpoint says (last token for
  gte-Qwen2 and e5-mistral). It loads `*Model` checkpoints, whose names lack
  the `model.` prefix, and `*ForCausalLM` checkpoints served with
  `--is-embedding` (their `lm_head` is not used).
- `LlamaForSequenceClassification` (and the Mistral / Qwen2 variants): the
  decoder plus transformers' `score` head (hidden → num_labels, no bias) on
  the last prompt token, as transformers does for an unpadded prompt.

Both run the decoder exactly as generation does (causal attention through the
KV pool), so last-token prompts are chunked and share the prefix cache.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from radixlm.model_executor.forward_batch import ForwardBatch
from radixlm.models.base import PoolingModel
from radixlm.models.llama import Biases, LlamaModel, llama_biases, load_llama_weights
from radixlm.models.pooler import PoolingConfig, pool

_QWEN2_BIASES = Biases(qkv=True)


class LlamaEmbeddingModel(PoolingModel):
    default_pooling = PoolingConfig("last", normalize=True)

    def __init__(self, config: Any, dtype: torch.dtype | None = None) -> None:
        super().__init__(config, dtype)
        self.model = LlamaModel(config, dtype or torch.get_default_dtype(), self.biases(config))

    @staticmethod
    def biases(config: Any) -> Biases:
        return llama_biases(config)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                forward_batch: ForwardBatch, input_embeds: torch.Tensor | None = None
                ) -> torch.Tensor:
        """→ hidden states [T, hidden] (final norm applied); writes K/V like generation."""
        return self.model(input_ids, positions, forward_batch, input_embeds)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed(input_ids)

    def pool_forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                     forward_batch: ForwardBatch) -> torch.Tensor:
        hidden = self.forward(input_ids, positions, forward_batch)  # [T, hidden]
        return pool(hidden, forward_batch.extend_lens, self.pooling.method)  # [B, hidden]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        def rename(name: str) -> str | None:
            if name.startswith("lm_head."):
                return None  # a *ForCausalLM checkpoint served for embeddings
            return name if name.startswith("model.") else f"model.{name}"

        load_llama_weights(self, weights, rename)


class MistralEmbeddingModel(LlamaEmbeddingModel):
    @staticmethod
    def biases(config: Any) -> Biases:
        return Biases()


class Qwen2EmbeddingModel(LlamaEmbeddingModel):
    @staticmethod
    def biases(config: Any) -> Biases:
        return _QWEN2_BIASES


class LlamaForSequenceClassification(LlamaEmbeddingModel):
    """Label logits from the last prompt token (no normalization)."""

    default_pooling = PoolingConfig("last", normalize=False)

    def __init__(self, config: Any, dtype: torch.dtype | None = None) -> None:
        super().__init__(config, dtype)
        dtype = dtype or torch.get_default_dtype()
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias=False, dtype=dtype)

    @property
    def num_labels(self) -> int:
        return int(self.config.num_labels)

    def pool_forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                     forward_batch: ForwardBatch) -> torch.Tensor:
        hidden = self.forward(input_ids, positions, forward_batch)  # [T, hidden]
        last = pool(hidden, forward_batch.extend_lens, "last")  # [B, hidden] float32
        return self.score(last.to(self.score.weight.dtype)).float()  # [B, num_labels]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_llama_weights(self, weights, lambda name: name)


class MistralForSequenceClassification(LlamaForSequenceClassification):
    @staticmethod
    def biases(config: Any) -> Biases:
        return Biases()


class Qwen2ForSequenceClassification(LlamaForSequenceClassification):
    @staticmethod
    def biases(config: Any) -> Biases:
        return _QWEN2_BIASES
