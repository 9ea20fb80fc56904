"""Architecture name (config.architectures) → model class.

Classes are named as "module:Class" strings and imported on first use, so
looking up one architecture does not import every model.
"""

from __future__ import annotations

from typing import Any

from radixlm.models.base import CausalLM
from radixlm.utils import resolve_lazy

_MODELS: dict[str, str | type[CausalLM]] = {
    "LlamaForCausalLM": "radixlm.models.llama:LlamaForCausalLM",
    "MistralForCausalLM": "radixlm.models.llama:MistralForCausalLM",
    "Qwen2ForCausalLM": "radixlm.models.llama:Qwen2ForCausalLM",
    "MinistralForCausalLM": "radixlm.models.llama:MinistralForCausalLM",
    "Qwen3ForCausalLM": "radixlm.models.qwen3:Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM": "radixlm.models.qwen3:Qwen3MoeForCausalLM",
    "Gemma3ForCausalLM": "radixlm.models.gemma3:Gemma3ForCausalLM",
    "Phi3ForCausalLM": "radixlm.models.phi3:Phi3ForCausalLM",
    "SmolLM3ForCausalLM": "radixlm.models.smollm3:SmolLM3ForCausalLM",
    "LlavaForConditionalGeneration": "radixlm.models.llava:LlavaForConditionalGeneration",
    "LlavaNextForConditionalGeneration": "radixlm.models.llava:LlavaNextForConditionalGeneration",
    "LlavaOnevisionForConditionalGeneration": (
        "radixlm.models.llava:LlavaOnevisionForConditionalGeneration"
    ),
    # Pooling models (served for /encode, /classify, /v1/embeddings, /v1/rerank).
    "LlamaModel": "radixlm.models.llama_pooling:LlamaEmbeddingModel",
    "MistralModel": "radixlm.models.llama_pooling:MistralEmbeddingModel",
    "Qwen2Model": "radixlm.models.llama_pooling:Qwen2EmbeddingModel",
    "LlamaForSequenceClassification": "radixlm.models.llama_pooling:LlamaForSequenceClassification",
    "MistralForSequenceClassification": (
        "radixlm.models.llama_pooling:MistralForSequenceClassification"
    ),
    "Qwen2ForSequenceClassification": "radixlm.models.llama_pooling:Qwen2ForSequenceClassification",
    "BertModel": "radixlm.models.hf_encoder:HFEncoderEmbeddingModel",
    "RobertaModel": "radixlm.models.hf_encoder:HFEncoderEmbeddingModel",
    "XLMRobertaModel": "radixlm.models.hf_encoder:HFEncoderEmbeddingModel",
    "BertForSequenceClassification": "radixlm.models.hf_encoder:HFEncoderForSequenceClassification",
    "RobertaForSequenceClassification": (
        "radixlm.models.hf_encoder:HFEncoderForSequenceClassification"
    ),
    "XLMRobertaForSequenceClassification": (
        "radixlm.models.hf_encoder:HFEncoderForSequenceClassification"
    ),
}

# --is-embedding serves a language model's hidden states, pooled, instead of its head.
_AS_EMBEDDING = {
    "LlamaForCausalLM": "LlamaModel",
    "MistralForCausalLM": "MistralModel",
    "Qwen2ForCausalLM": "Qwen2Model",
    "BertForMaskedLM": "BertModel",
    "RobertaForMaskedLM": "RobertaModel",
    "XLMRobertaForMaskedLM": "XLMRobertaModel",
}


def register_model(architecture: str, cls: str | type[CausalLM]) -> None:
    """Map an architecture name to a class, or to a "module:Class" string imported lazily."""
    _MODELS[architecture] = cls


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def pooling_architectures() -> list[str]:
    """Architectures that answer with vectors (served as non-generation models)."""
    return sorted(a for a in _MODELS if a.endswith(("Model", "ForSequenceClassification")))


def _resolve(entry: str | type[CausalLM]) -> type[CausalLM]:
    cls: type[CausalLM] = resolve_lazy(entry)
    return cls


def get_model_class(config: Any, is_embedding: bool = False) -> type[CausalLM]:
    """The class for the first of `config.architectures` that is supported.

    With `is_embedding`, a causal LM is served as its embedding model, and a
    model that can only generate is an error. Raises ValueError naming the
    architectures asked for and those supported.
    """
    architectures = list(getattr(config, "architectures", None) or [])
    for arch in architectures:
        if is_embedding:
            arch = _AS_EMBEDDING.get(arch, arch)
        if arch in _MODELS:
            cls = _resolve(_MODELS[arch])
            if is_embedding and cls.is_generation:
                raise ValueError(f"{arch} cannot be served with --is-embedding; embedding "
                                 f"architectures: {', '.join(sorted(_AS_EMBEDDING))} and "
                                 f"those in {', '.join(pooling_architectures())}")
            return cls
    raise ValueError(
        f"unsupported model architecture {architectures or '(none in config.json)'}; "
        f"supported: {', '.join(supported_architectures())}"
    )
