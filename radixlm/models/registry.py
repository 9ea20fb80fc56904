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
    "LlavaForConditionalGeneration": "radixlm.models.llava:LlavaForConditionalGeneration",
    "LlavaNextForConditionalGeneration": "radixlm.models.llava:LlavaNextForConditionalGeneration",
    "LlavaOnevisionForConditionalGeneration": (
        "radixlm.models.llava:LlavaOnevisionForConditionalGeneration"
    ),
}


def register_model(architecture: str, cls: str | type[CausalLM]) -> None:
    """Map an architecture name to a class, or to a "module:Class" string imported lazily."""
    _MODELS[architecture] = cls


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def _resolve(entry: str | type[CausalLM]) -> type[CausalLM]:
    cls: type[CausalLM] = resolve_lazy(entry)
    return cls


def get_model_class(config: Any) -> type[CausalLM]:
    """The class for the first of `config.architectures` that is supported.

    Raises ValueError naming the architectures asked for and those supported.
    """
    architectures = list(getattr(config, "architectures", None) or [])
    for arch in architectures:
        if arch in _MODELS:
            return _resolve(_MODELS[arch])
    raise ValueError(
        f"unsupported model architecture {architectures or '(none in config.json)'}; "
        f"supported: {', '.join(supported_architectures())}"
    )
