"""The Llama family: Llama 2/3.x (and SmolLM2), Mistral and Ministral, Qwen2.

Declared over the shared decoder blocks (models/decoder.py): the family is the
plain pre-norm decoder, and its members differ in config values and in which
projections carry a bias (Qwen2: q/k/v; Llama: all four attention projections
when `attention_bias`, the MLP when `mlp_bias`). Llama 3.x's rope scaling
(`rope_type: llama3`) is the config's, through layers/rotary.py. Sliding-window
attention follows the config as transformers reads it (Mistral: every layer;
Ministral and Qwen2: the `layer_types` marked sliding).
"""

from __future__ import annotations

from typing import Any

import torch

from radixlm.models.decoder import (
    Biases,
    DecoderArch,
    DecoderForCausalLM,
    DecoderModel,
    LayerSpec,
    head_dim,
)
from radixlm.models.decoder_weights import load_decoder_weights

__all__ = ["Biases", "LlamaForCausalLM", "LlamaModel", "MinistralForCausalLM",
           "MistralForCausalLM", "Qwen2ForCausalLM", "head_dim", "load_llama_weights"]

load_llama_weights = load_decoder_weights  # the name the pooling models import


def llama_biases(config: Any) -> Biases:
    attention_bias = bool(getattr(config, "attention_bias", False))
    return Biases(attention_bias, attention_bias, bool(getattr(config, "mlp_bias", False)))


def _check_activation(config: Any) -> None:
    if getattr(config, "hidden_act", "silu") != "silu":
        raise NotImplementedError(f"hidden_act {config.hidden_act!r} is not supported")


class LlamaModel(DecoderModel):
    """The Llama-family decoder without its head (for the pooling models)."""

    def __init__(self, config: Any, dtype: torch.dtype, biases: Biases) -> None:
        _check_activation(config)
        super().__init__(config, dtype, DecoderArch(biases=biases),
                         LlamaForCausalLM.layer_specs(config))


class LlamaForCausalLM(DecoderForCausalLM):
    @classmethod
    def arch(cls, config: Any) -> DecoderArch:
        _check_activation(config)
        return DecoderArch(biases=cls.biases(config))

    @staticmethod
    def biases(config: Any) -> Biases:
        return llama_biases(config)

    @classmethod
    def layer_specs(cls, config: Any) -> list[LayerSpec]:
        return super().layer_specs(config)


class MistralForCausalLM(LlamaForCausalLM):
    @staticmethod
    def biases(config: Any) -> Biases:
        return Biases()


class MinistralForCausalLM(MistralForCausalLM):
    """Ministral: Mistral with sliding-window and global layers (`layer_types`)."""


class Qwen2ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def biases(config: Any) -> Biases:
        return Biases(qkv=True)
