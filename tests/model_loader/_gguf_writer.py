"""Write a tiny transformers model as llama.cpp's converter would (convert_hf_to_gguf.py).

Independent of radixlm's mapping on purpose: tensor names come from gguf-py's own
`TensorNameMap`, and the converter's fix-ups are redone here as llama.cpp does them:
Q/K rows permuted for `llama` and `smollm3`, Gemma norms stored as 1 + w, Phi-3's
fused qkv / gate_up kept fused, MoE experts stacked into 3D `ffn_*_exps` tensors,
Llama 3 rope scaling written as the `rope_freqs` tensor, Phi-3's LongRoPE as
`rope_factors_long` / `_short`.

Weights of two or more dimensions are stored in the asked format (F32, F16, Q8_0);
norms and other vectors stay F32, as llama.cpp keeps them. `roundtrip` puts the same
rounding into the transformers model, so the test compares like with like.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

GGUF_ARCH = {"llama": "LLAMA", "qwen3": "QWEN3", "qwen3_moe": "QWEN3MOE",
             "gemma3_text": "GEMMA3", "phi3": "PHI3", "smollm3": "SMOLLM3", "qwen2": "QWEN2"}
PERMUTED = {"llama", "smollm3"}


def _qtype(name: str) -> Any:
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType[name]


def stored(array: np.ndarray, qtype: str) -> tuple[np.ndarray, Any]:
    """(data as written, its GGML type): vectors in F32, the rest in `qtype`."""
    from gguf.quants import quantize

    array = np.ascontiguousarray(array, dtype=np.float32)
    if array.ndim < 2 or qtype == "F32":
        return array, _qtype("F32")
    if qtype == "F16":
        return array.astype(np.float16), _qtype("F16")
    return quantize(array, _qtype(qtype)), _qtype(qtype)


def rounded(tensor: torch.Tensor, qtype: str) -> torch.Tensor:
    """The tensor as it reads back from the format (the same rounding the file holds)."""
    from gguf.quants import dequantize

    if tensor.dim() < 2 or qtype == "F32":
        return tensor
    data, kind = stored(tensor.detach().float().numpy(), qtype)
    back = data.astype(np.float32) if qtype == "F16" else dequantize(data, kind)
    return torch.from_numpy(np.ascontiguousarray(back)).reshape(tensor.shape).to(tensor.dtype)


@torch.no_grad()
def roundtrip(model: torch.nn.Module, qtype: str) -> torch.nn.Module:
    """Every weight of two or more dimensions through the format, in place."""
    for p in model.parameters():
        p.copy_(rounded(p, qtype))
    return model


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: each head's rows as (D/2 pairs, 2)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def _rope_freqs(config: Any, head_dim: int) -> np.ndarray | None:
    """llama.cpp's llama3 rope factors (LlamaModel.generate_extra_tensors)."""
    params = config.rope_parameters
    if params.get("rope_type") != "llama3":
        return None
    base, factor = params["rope_theta"], params["factor"]
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    old = params["original_max_position_embeddings"]
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _tensors(model: torch.nn.Module, model_type: str) -> dict[str, np.ndarray]:
    """Hugging Face name → float32 array, with the experts split per expert (as the
    checkpoint stores them) and the converter's per-tensor fix-ups applied."""
    config = model.config
    out: dict[str, np.ndarray] = {}
    for name, p in model.state_dict().items():
        a = p.detach().float().numpy()
        if name.endswith("mlp.experts.gate_up_proj"):  # [E, 2I, H]
            inter = a.shape[1] // 2
            out[name.replace("gate_up_proj", "gate_proj")] = a[:, :inter]
            out[name.replace("gate_up_proj", "up_proj")] = a[:, inter:]
            continue
        if name.endswith("mlp.experts.down_proj"):  # [E, H, I]
            out[name] = a
            continue
        if model_type in PERMUTED and name.endswith("self_attn.q_proj.weight"):
            a = _permute(a, config.num_attention_heads)
        if model_type in PERMUTED and name.endswith("self_attn.k_proj.weight"):
            a = _permute(a, config.num_key_value_heads)
        if model_type == "gemma3_text" and name.endswith("norm.weight"):
            a = a + 1.0
        out[name] = a
    if getattr(config, "tie_word_embeddings", False):
        out.pop("lm_head.weight", None)
    return out


def write_gguf(model: torch.nn.Module, path: Path, qtype: str = "F32",
               eot_token_id: int | None = None) -> Path:
    """Write `model` (a tiny transformers causal LM) as a GGUF file at `path`."""
    import gguf

    config, model_type = model.config, model.config.model_type
    arch = gguf.MODEL_ARCH[GGUF_ARCH[model_type]]
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    _write_metadata(writer, config, model_type, head_dim, eot_token_id)
    for name, array in _tensors(model, model_type).items():
        gguf_name = names.get_name(name.removesuffix(".weight").removesuffix(".bias"))
        suffix = ".bias" if name.endswith(".bias") else ".weight"
        if gguf_name is None:
            raise KeyError(f"gguf-py maps no tensor for {name}")
        data, kind = stored(array, qtype)
        writer.add_tensor(gguf_name + suffix, data, raw_dtype=kind)
    rope_freqs = _rope_freqs(config, head_dim) if model_type in PERMUTED else None
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs)
    params = config.rope_parameters
    if model_type == "phi3" and params.get("rope_type") == "longrope":
        writer.add_tensor("rope_factors_long.weight", np.array(params["long_factor"], np.float32))
        writer.add_tensor("rope_factors_short.weight",
                          np.array(params["short_factor"], np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _write_metadata(w: Any, config: Any, model_type: str, head_dim: int,
                    eot_token_id: int | None) -> None:
    w.add_block_count(config.num_hidden_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_vocab_size(config.vocab_size)
    w.add_eos_token_id(2)
    w.add_bos_token_id(1)
    if eot_token_id is not None:
        w.add_eot_token_id(eot_token_id)
    params = config.rope_parameters
    if model_type == "gemma3_text":
        full = params["full_attention"]
        w.add_rope_freq_base(full["rope_theta"])
        if full.get("rope_type") == "linear":
            w.add_rope_scaling_type(gguf_rope_scaling("linear"))
            w.add_rope_scaling_factor(full["factor"])
        w.add_sliding_window(config.sliding_window)
        if config.final_logit_softcapping:
            w.add_final_logit_softcapping(config.final_logit_softcapping)
        return
    w.add_rope_freq_base(params["rope_theta"])
    rotary = int(head_dim * params.get("partial_rotary_factor", 1.0))
    w.add_rope_dimension_count(rotary)
    if model_type == "qwen3_moe":
        w.add_expert_count(config.num_experts)
        w.add_expert_used_count(config.num_experts_per_tok)
        w.add_expert_feed_forward_length(config.moe_intermediate_size)
    if model_type == "phi3":
        w.add_sliding_window(config.sliding_window or 0)
        if params.get("rope_type") == "longrope":
            original = params["original_max_position_embeddings"]
            w.add_rope_scaling_orig_ctx_len(original)
            scale = config.max_position_embeddings / original
            w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)))


def gguf_rope_scaling(name: str) -> Any:
    import gguf

    return gguf.RopeScalingType(name)
