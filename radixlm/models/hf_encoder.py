"""Bidirectional encoders (BERT, RoBERTa, XLM-RoBERTa) through transformers' own modules.

An encoder attends in both directions, so it has no KV cache to share and no
chunks: the scheduler hands it each prompt whole, from position 0
(`is_causal = False`). This wrapper pads a step's prompts into one
[B, L] batch with an attention mask, runs transformers' model on it, and
returns one row per prompt:

- `HFEncoderEmbeddingModel` (`BertModel`, `RobertaModel`, `XLMRobertaModel`):
  the last hidden states pooled as the checkpoint says (sentence-transformers'
  files), CLS and normalized by default;
- `HFEncoderForSequenceClassification` (`*ForSequenceClassification`, e.g. a
  cross-encoder reranker): transformers' classifier logits.

Segment ids (`token_type_ids`, for a query/document pair) come per request in
`forward_batch.token_type_ids`; without them every token is segment 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from radixlm.model_executor.forward_batch import ForwardBatch
from radixlm.models.base import PoolingModel
from radixlm.models.pooler import PoolingConfig


class _HFEncoder(PoolingModel):
    is_causal = False
    default_pooling = PoolingConfig("cls", normalize=True)

    def __init__(self, config: Any, dtype: torch.dtype | None = None) -> None:
        super().__init__(config, dtype)
        self.hf = self._build(config)
        if dtype is not None:
            self.hf.to(dtype)
        self.hf.eval()

    @staticmethod
    def _build(config: Any) -> nn.Module:
        raise NotImplementedError

    def _padded(self, input_ids: torch.Tensor, forward_batch: ForwardBatch
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids [B, L], attention mask [B, L], token type ids [B, L]) of the step's prompts."""
        if any(forward_batch.prefix_lens):
            raise ValueError("an encoder computes each prompt whole, from position 0")
        lens = forward_batch.extend_lens
        pad = int(getattr(self.config, "pad_token_id", None) or 0)
        ids = torch.full((len(lens), max(lens)), pad, dtype=torch.int64, device=input_ids.device)
        mask = torch.zeros_like(ids)
        types = torch.zeros_like(ids)
        segments = forward_batch.token_type_ids or [None] * len(lens)
        for i, seq in enumerate(input_ids.split(lens)):
            ids[i, : lens[i]] = seq
            mask[i, : lens[i]] = 1
            if segments[i] is not None:
                types[i, : lens[i]] = torch.tensor(segments[i], dtype=torch.int64)
        return ids, mask, types

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise TypeError("an encoder takes token ids only")

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load by transformers' names, with or without the base model's prefix
        ("bert.", "roberta."); heads the model lacks (a masked-LM head) are skipped.
        Raises ValueError when a parameter is missing or a shape differs."""
        own = self.hf.state_dict()
        prefix = f"{getattr(self.hf, 'base_model_prefix', '')}."
        state: dict[str, torch.Tensor] = {}
        for name, tensor in weights:
            for candidate in (name, prefix + name, name.removeprefix(prefix)):
                if candidate in own:
                    if own[candidate].shape != tensor.shape:
                        raise ValueError(f"shape mismatch for {name!r}: model "
                                         f"{tuple(own[candidate].shape)}, checkpoint "
                                         f"{tuple(tensor.shape)}")
                    state[candidate] = tensor
                    break
        required = {n for n, _ in self.hf.named_parameters()}
        missing = sorted(required - set(state))
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} weights, e.g. {missing[:5]}")
        self.hf.load_state_dict(state, strict=False)


class HFEncoderEmbeddingModel(_HFEncoder):
    @staticmethod
    def _build(config: Any) -> nn.Module:
        from transformers import AutoModel

        return AutoModel.from_config(config, add_pooling_layer=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                forward_batch: ForwardBatch, input_embeds: torch.Tensor | None = None
                ) -> torch.Tensor:
        """→ last hidden states [T, hidden], request-major like the input."""
        ids, mask, types = self._padded(input_ids, forward_batch)
        out = self.hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
        return out.last_hidden_state[mask.bool()]  # [T, hidden]

    def pool_forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                     forward_batch: ForwardBatch) -> torch.Tensor:
        from radixlm.models.pooler import pool

        hidden = self.forward(input_ids, positions, forward_batch)  # [T, hidden]
        return pool(hidden, forward_batch.extend_lens, self.pooling.method)  # [B, hidden]


class HFEncoderForSequenceClassification(_HFEncoder):
    default_pooling = PoolingConfig("cls", normalize=False)

    @staticmethod
    def _build(config: Any) -> nn.Module:
        from transformers import AutoModelForSequenceClassification

        return AutoModelForSequenceClassification.from_config(config)

    @property
    def num_labels(self) -> int:
        return int(self.config.num_labels)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                forward_batch: ForwardBatch, input_embeds: torch.Tensor | None = None
                ) -> torch.Tensor:
        return self.pool_forward(input_ids, positions, forward_batch)

    def pool_forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                     forward_batch: ForwardBatch) -> torch.Tensor:
        ids, mask, types = self._padded(input_ids, forward_batch)
        out = self.hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
        return out.logits.float()  # [B, num_labels]
