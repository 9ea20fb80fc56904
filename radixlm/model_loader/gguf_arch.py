"""How llama.cpp's architectures map onto Hugging Face models.

Per GGUF architecture: the transformers model type and class, the config
built from the metadata, the Hugging Face name of each tensor, and the fix-ups
llama.cpp's converter applied to some tensors (the Q/K row permutation of
`llama` models, undone by `unpermute_qk`).
"""

from __future__ import annotations

import logging
import re
from typing import Any

import torch

from radixlm.model_loader.gguf_file import GgufFile

logger = logging.getLogger(__name__)

# GGUF architecture → (transformers model_type, architectures entry)
_ARCHS = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
}
# Architectures whose attn_q / attn_k rows llama.cpp permuted.
PERMUTED_ARCHS = {"llama"}

_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_SKIPPED_TENSORS = {"rope_freqs.weight"}  # llama3 rope factors; the config's rope scaling rules


def hf_tensor_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a llama.cpp tensor; None for tensors the model does not use."""
    if gguf_name in _SKIPPED_TENSORS:
        return None
    base, _, suffix = gguf_name.rpartition(".")
    if base in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[base]}.{suffix}"
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    if m and m.group(2) in _LAYER_TENSORS:
        return f"model.layers.{m.group(1)}.{_LAYER_TENSORS[m.group(2)]}.{suffix}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no Hugging Face counterpart here")


def unpermute_qk(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's per-head row interleaving of a Q or K projection (weight or bias).

    llama.cpp stores each head's rows as (D/2 pairs, 2); Hugging Face as (2 halves, D/2).
    """
    head_dim = weight.shape[0] // num_heads
    rest = weight.shape[1:]
    w = weight.reshape(num_heads, head_dim // 2, 2, *rest)  # [H, D/2, 2, ...]
    return w.transpose(1, 2).reshape(weight.shape).contiguous()  # [H * D, ...]


def arch_value(meta: dict[str, Any], key: str, default: Any = None) -> Any:
    return meta.get(f"{meta['general.architecture']}.{key}", default)


def hf_config_kwargs(gguf: GgufFile) -> tuple[str, dict[str, Any]]:
    """(model_type, config kwargs) for transformers' config of this GGUF model."""
    meta = gguf.metadata
    arch = meta["general.architecture"]
    if arch not in _ARCHS:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported (supported: {sorted(_ARCHS)})"
        )
    model_type, hf_arch = _ARCHS[arch]
    num_heads = int(arch_value(meta, "attention.head_count"))
    hidden = int(arch_value(meta, "embedding_length"))
    names = {t.name for t in gguf.tensors}
    vocab = arch_value(meta, "vocab_size") or meta.get("tokenizer.ggml.tokens")
    if vocab is None:
        raise ValueError(f"{gguf.path}: no vocabulary size in the metadata")
    kwargs: dict[str, Any] = {
        "architectures": [hf_arch],
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(arch_value(meta, "feed_forward_length")),
        "num_hidden_layers": int(arch_value(meta, "block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(arch_value(meta, "attention.head_count_kv", num_heads)),
        "head_dim": int(
            arch_value(meta, "attention.key_length")
            or arch_value(meta, "rope.dimension_count")
            or hidden // num_heads
        ),
        "max_position_embeddings": int(arch_value(meta, "context_length", 2048)),
        "rms_norm_eps": float(arch_value(meta, "attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(arch_value(meta, "rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
    }
    scaling = arch_value(meta, "rope.scaling.type")
    if scaling in ("linear", "yarn"):
        kwargs["rope_scaling"] = {
            "rope_type": scaling,
            "factor": float(arch_value(meta, "rope.scaling.factor", 1.0)),
            "original_max_position_embeddings": int(
                arch_value(
                    meta, "rope.scaling.original_context_length", kwargs["max_position_embeddings"]
                )
            ),
        }
    if "rope_freqs.weight" in names:
        logger.warning(
            "%s: ignoring rope_freqs (llama3 rope factors); positions beyond the "
            "original context may differ from llama.cpp",
            gguf.path,
        )
    return model_type, kwargs
