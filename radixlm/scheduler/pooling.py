"""What the scheduler says about a pooling model, and how it answers a pooling request.

A pooling request is a prefill-only request (max_new_tokens 0): it is
scheduled like any prompt, its step's result carries its vector, and it
finishes with "length" like a generation of zero tokens. Its answer goes
straight to the TokenizerManager as an `EmbeddingOut` (there is no text to
detokenize).
"""

from __future__ import annotations

from typing import Any

from radixlm.messages.io_struct import EmbeddingOut, FinishReason
from radixlm.models.base import PoolingModel
from radixlm.scheduler.request import Req


def pooling_info(model: Any) -> dict[str, Any]:
    """Model-info entries of a pooling model (none for a generation model)."""
    if not isinstance(model, PoolingModel):
        return {}
    config = model.config
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    matryoshka = getattr(config, "matryoshka_dimensions", None)
    id2label = getattr(config, "id2label", None) or {}
    info: dict[str, Any] = {
        "pooling_method": model.pooling.method,
        "normalize": model.num_labels == 0 and model.pooling.normalize,
        "num_labels": model.num_labels,
        "embedding_dim": model.num_labels or hidden,
        # Matryoshka models (config.matryoshka_dimensions or is_matryoshka) may be
        # truncated with the OpenAI `dimensions` field.
        "matryoshka_dimensions": list(matryoshka) if matryoshka else None,
        "is_matryoshka": bool(matryoshka) or bool(getattr(config, "is_matryoshka", False)),
        "is_causal": model.is_causal,
        # sentence-transformers' cross-encoder activation (the rerank score), if named
        "ce_activation": getattr(config, "sbert_ce_default_activation_function", None),
    }
    if model.num_labels:
        info["id2label"] = {str(k): str(v) for k, v in id2label.items()}
    return info


def embedding_out(req: Req) -> EmbeddingOut:
    reason = req.finished_reason or FinishReason("abort", message="Not finished")
    return EmbeddingOut(rid=req.rid, embedding=req.embedding, finished_reason=reason,
                        prompt_tokens=req.num_prompt_tokens,
                        cached_tokens=req.num_cached_tokens or 0)
