"""How llama.cpp's architectures map onto Hugging Face models.

`plan_gguf(metadata, tensors)` is a pure function of a GGUF file's metadata
and tensor table (no tensor data): it gives the transformers model type and
config, and for every tensor the model uses, the Hugging Face tensor(s) it
becomes and the fix-up that undoes what llama.cpp's converter
(convert_hf_to_gguf.py) did to it:

- `llama`, `smollm3` (and Mistral files, which are `llama`): the rows of each
  head of attn_q / attn_k were interleaved for llama.cpp's rotary (`UNPERMUTE`);
- `gemma3`: every norm weight was stored as 1 + w (`SHIFT` by -1);
- `phi3`: attn_qkv and ffn_up (gate | up) stay fused, as the Hugging Face
  checkpoint has them (the model splits them at load);
- `qwen3moe`: the experts are 3D tensors `ffn_{gate,up,down}_exps` [E, out, in];
  each expert's slice (`expert`) becomes `mlp.experts.{e}.*_proj.weight`;
- `qwen2`, `qwen3`: names only.

A few small float tensors hold what the config needs (`config_tensors`): Llama
3's rope frequency factors (`rope_freqs`, turned back into transformers'
`llama3` rope scaling and checked against them) and Phi-3's LongRoPE factors
(`rope_factors_long` / `_short`). `complete_config(plan, values)` adds them.
A loader then applies each `TensorPlan` to its tensor (`apply_plan`): the expert slice, then
`fix` them (both work on a dequantized float tensor; the row selections and
the permutation are row operations, so a quantized tensor can take them too,
block rows intact, for any format whose blocks run along a row).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from radixlm.model_loader.gguf_file import GgufTensorInfo

logger = logging.getLogger(__name__)

# GGUF architecture → (transformers model_type, architectures entry)
ARCHS: dict[str, tuple[str, str]] = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "qwen3moe": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "gemma3": ("gemma3_text", "Gemma3ForCausalLM"),
    "phi3": ("phi3", "Phi3ForCausalLM"),
    "smollm3": ("smollm3", "SmolLM3ForCausalLM"),
}
# Architectures whose attn_q / attn_k rows llama.cpp permuted.
PERMUTED_ARCHS = frozenset({"llama", "smollm3"})

UNPERMUTE, SHIFT = "unpermute", "shift"

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
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
}
_ARCH_LAYER_TENSORS: dict[str, dict[str, str]] = {
    "gemma3": {"post_attention_norm": "post_attention_layernorm",
               "ffn_norm": "pre_feedforward_layernorm",
               "post_ffw_norm": "post_feedforward_layernorm"},
    "phi3": {"ffn_up": "mlp.gate_up_proj"},  # gate | up, fused
}
_EXPERT_TENSORS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj",
                   "ffn_down_exps": "down_proj"}
_CONFIG_TENSORS = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}


class TensorPlan(NamedTuple):
    """One Hugging Face tensor from one GGUF tensor."""

    gguf_name: str
    hf_name: str
    expert: int | None = None  # a slice of dim 0 (one expert of a 3D tensor); None: all
    fix: tuple[str, float] | None = None  # (UNPERMUTE, num_heads) or (SHIFT, delta)


class GgufPlan(NamedTuple):
    model_type: str  # transformers' model_type
    config: dict[str, Any]  # AutoConfig.for_model(model_type, **config)
    tensors: list[TensorPlan]
    config_tensors: tuple[str, ...]  # GGUF tensors whose values complete_config needs
    generation_config: dict[str, Any]  # generation_config.json (end-of-turn tokens)


def arch_value(meta: Mapping[str, Any], key: str, default: Any = None) -> Any:
    return meta.get(f"{meta['general.architecture']}.{key}", default)


def _scalar(value: Any) -> Any:
    """A per-layer array (some files give head counts or FFN sizes per layer) → its value,
    which must be one for all layers here."""
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise ValueError(f"per-layer values that differ ({sorted(set(value))[:4]}...) "
                             "are not supported")
        return value[0]
    return value


def plan_gguf(metadata: Mapping[str, Any], tensors: Sequence[GgufTensorInfo]) -> GgufPlan:
    """The model type, config and tensor plans of a GGUF file (see the module docstring).
    Raises ValueError for an architecture or a tensor this module does not know."""
    arch = metadata.get("general.architecture")
    if arch not in ARCHS:
        raise ValueError(f"GGUF architecture {arch!r} is not supported (supported: "
                         f"{', '.join(sorted(ARCHS))})")
    model_type, _ = ARCHS[arch]
    shapes = {t.name: t.shape for t in tensors}
    config = _base_config(metadata, shapes)
    _ARCH_CONFIG.get(arch, lambda m, s, c: None)(metadata, shapes, config)
    plans = [p for t in tensors for p in _tensor_plans(arch, t, config)]
    config_tensors = tuple(sorted(n for n in shapes if n in _CONFIG_TENSORS))
    return GgufPlan(model_type, config, plans, config_tensors, _generation_config(metadata))


def _base_config(meta: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]
                 ) -> dict[str, Any]:
    arch = meta["general.architecture"]
    num_heads = int(_scalar(arch_value(meta, "attention.head_count")))
    hidden = int(arch_value(meta, "embedding_length"))
    if "token_embd.weight" not in shapes:
        raise ValueError("the GGUF file has no token_embd tensor")
    head_dim = int(arch_value(meta, "attention.key_length") or hidden // num_heads)
    config: dict[str, Any] = {
        "architectures": [ARCHS[arch][1]],
        # NOTE: the embedding's rows, not the metadata: llama.cpp trims Gemma's padding rows.
        "vocab_size": int(shapes["token_embd.weight"][0]),
        "hidden_size": hidden,
        "intermediate_size": int(_scalar(arch_value(meta, "feed_forward_length", 0)) or 0),
        "num_hidden_layers": int(arch_value(meta, "block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(_scalar(arch_value(meta, "attention.head_count_kv",
                                                      num_heads))),
        "head_dim": head_dim,
        "max_position_embeddings": int(arch_value(meta, "context_length", 2048)),
        "rms_norm_eps": float(arch_value(meta, "attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(arch_value(meta, "rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in shapes,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
    }
    rope_dim = arch_value(meta, "rope.dimension_count")
    if rope_dim and int(rope_dim) < head_dim:
        config["partial_rotary_factor"] = int(rope_dim) / head_dim
    scaling = arch_value(meta, "rope.scaling.type")
    if scaling in ("linear", "yarn"):
        config["rope_scaling"] = {
            "rope_type": scaling,
            "factor": float(arch_value(meta, "rope.scaling.factor", 1.0)),
            "original_max_position_embeddings": int(arch_value(
                meta, "rope.scaling.original_context_length", config["max_position_embeddings"])),
        }
    return config


def _generation_config(meta: Mapping[str, Any]) -> dict[str, Any]:
    """End of turn: the eos token and llama.cpp's end-of-turn / end-of-message tokens."""
    ids = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    eos = list(dict.fromkeys(int(i) for i in ids if i is not None))
    out: dict[str, Any] = {}
    if eos:
        out["eos_token_id"] = eos if len(eos) > 1 else eos[0]
    if meta.get("tokenizer.ggml.bos_token_id") is not None:
        out["bos_token_id"] = int(meta["tokenizer.ggml.bos_token_id"])
    return out


# ---------------------------------------------------------------- per-architecture config


def _qwen3moe_config(meta: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]],
                     config: dict[str, Any]) -> None:
    moe_inter = int(arch_value(meta, "expert_feed_forward_length"))
    config.update(
        num_experts=int(arch_value(meta, "expert_count")),
        num_experts_per_tok=int(arch_value(meta, "expert_used_count")),
        moe_intermediate_size=moe_inter,
        # llama.cpp's qwen3moe graph always renormalizes the top-k weights
        norm_topk_prob=bool(arch_value(meta, "expert_weights_norm", True)),
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )
    config["intermediate_size"] = config["intermediate_size"] or moe_inter


def _gemma3_config(meta: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]],
                   config: dict[str, Any]) -> None:
    num_layers = config["num_hidden_layers"]
    window = int(arch_value(meta, "attention.sliding_window", 0) or 0)
    pattern = arch_value(meta, "attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):  # per layer: True = sliding
        sliding = [bool(p) for p in pattern]
    else:  # llama.cpp's set_swa_pattern(n): every n-th layer is global
        sliding = [bool((i + 1) % int(pattern)) for i in range(num_layers)]
    if not window:
        sliding = [False] * num_layers
    full: dict[str, Any] = {"rope_type": "default", "rope_theta": config.pop("rope_theta")}
    scaling = config.pop("rope_scaling", None)
    if scaling and scaling["rope_type"] == "linear":  # llama.cpp scales the global layers only
        full.update(rope_type="linear", factor=scaling["factor"])
    local = {"rope_type": "default",
             "rope_theta": float(arch_value(meta, "rope.freq_base_swa", 10000.0))}
    # llama.cpp (llama_load_hparams_gemma3): 27B scales by hidden / heads, the others by head_dim
    scalar = (config["hidden_size"] // config["num_attention_heads"] if num_layers == 62
              else config["head_dim"])
    cap = arch_value(meta, "final_logit_softcapping")
    config.update(
        sliding_window=window or None,
        layer_types=["sliding_attention" if s else "full_attention" for s in sliding],
        rope_parameters={"full_attention": full, "sliding_attention": local},
        query_pre_attn_scalar=scalar,
        final_logit_softcapping=float(cap) if cap else None,
        hidden_activation="gelu_pytorch_tanh",
    )


def _phi3_config(meta: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]],
                 config: dict[str, Any]) -> None:
    window = int(arch_value(meta, "attention.sliding_window", 0) or 0)
    config["sliding_window"] = window or None  # 0: none (Phi-4-mini files)
    original = arch_value(meta, "rope.scaling.original_context_length")
    if original:
        config["original_max_position_embeddings"] = int(original)
    if "rope_factors_long.weight" in shapes:  # the factor lists come in complete_config
        config["rope_scaling"] = {
            "rope_type": "longrope",
            "original_max_position_embeddings": int(original or config["max_position_embeddings"]),
            "long_factor": [], "short_factor": [],
        }
        attn_factor = arch_value(meta, "rope.scaling.attn_factor")
        original = config["rope_scaling"]["original_max_position_embeddings"]
        scale = config["max_position_embeddings"] / original
        default = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
        if attn_factor and abs(float(attn_factor) - default) > 1e-5:  # else transformers' own
            config["rope_scaling"]["attention_factor"] = float(attn_factor)


def _smollm3_config(meta: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]],
                    config: dict[str, Any]) -> None:
    config["no_rope_layer_interval"] = 4  # llama.cpp: n_no_rope_layer_step = 4


_ARCH_CONFIG = {"qwen3moe": _qwen3moe_config, "gemma3": _gemma3_config,
                "phi3": _phi3_config, "smollm3": _smollm3_config}


# ---------------------------------------------------------------- tensors


def _tensor_plans(arch: str, info: GgufTensorInfo, config: dict[str, Any]) -> list[TensorPlan]:
    name = info.name
    if name in _CONFIG_TENSORS:
        return []
    base, _, suffix = name.rpartition(".")
    if base in _GLOBAL_TENSORS:
        hf = f"{_GLOBAL_TENSORS[base]}.{suffix}"
        return [TensorPlan(name, hf, fix=_norm_fix(arch, hf))]
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    if m is None:
        raise ValueError(f"GGUF tensor {name!r} has no Hugging Face counterpart here")
    layer, kind = m.group(1), m.group(2)
    prefix = f"model.layers.{layer}"
    if kind in _EXPERT_TENSORS:
        return [TensorPlan(name, f"{prefix}.mlp.experts.{e}.{_EXPERT_TENSORS[kind]}.{suffix}",
                           expert=e)
                for e in range(info.shape[0])]
    module = _ARCH_LAYER_TENSORS.get(arch, {}).get(kind) or _LAYER_TENSORS.get(kind)
    if module is None:
        raise ValueError(f"GGUF tensor {name!r} has no Hugging Face counterpart here")
    hf = f"{prefix}.{module}.{suffix}"
    fix = _norm_fix(arch, hf)
    if arch in PERMUTED_ARCHS and kind in ("attn_q", "attn_k"):
        heads = config["num_attention_heads" if kind == "attn_q" else "num_key_value_heads"]
        fix = (UNPERMUTE, float(heads))
    return [TensorPlan(name, hf, fix=fix)]


def _norm_fix(arch: str, hf_name: str) -> tuple[str, float] | None:
    """Gemma's norms were stored as 1 + w (llama.cpp's norm_shift)."""
    return (SHIFT, -1.0) if arch == "gemma3" and hf_name.endswith("norm.weight") else None


def unpermute_qk(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's per-head row interleaving of a Q or K projection (weight or bias).

    llama.cpp stores each head's rows as (D/2 pairs, 2); Hugging Face as (2 halves, D/2).
    """
    head_dim = weight.shape[0] // num_heads
    rest = weight.shape[1:]
    w = weight.reshape(num_heads, head_dim // 2, 2, *rest)  # [H, D/2, 2, ...]
    return w.transpose(1, 2).reshape(weight.shape).contiguous()  # [H * D, ...]


def apply_plan(tensor: torch.Tensor, plan: TensorPlan) -> torch.Tensor:
    """The Hugging Face tensor from its GGUF tensor (float, in torch's shape order)."""
    if plan.expert is not None:
        tensor = tensor[plan.expert]
    if plan.fix is None:
        return tensor
    kind, value = plan.fix
    if kind == UNPERMUTE:
        return unpermute_qk(tensor, int(value))
    if kind == SHIFT:
        return tensor + value
    raise ValueError(f"unknown fix-up {kind!r}")


# ---------------------------------------------------------------- config from tensors


def complete_config(plan: GgufPlan, values: Mapping[str, Any]) -> dict[str, Any]:
    """The config with what `plan.config_tensors` hold: `values` maps each of them to its
    float values (any array-like)."""
    config = dict(plan.config)
    if "rope_factors_long.weight" in values:
        longrope = dict(config["rope_scaling"])
        longrope["long_factor"] = [float(x) for x in np.ravel(values["rope_factors_long.weight"])]
        longrope["short_factor"] = [float(x) for x in np.ravel(
            values.get("rope_factors_short.weight", values["rope_factors_long.weight"]))]
        config["rope_scaling"] = longrope
    if "rope_freqs.weight" in values and "rope_scaling" not in config:
        rotary = int(config["head_dim"] * config.get("partial_rotary_factor", 1.0))
        scaling = llama3_rope_scaling(np.ravel(values["rope_freqs.weight"]),
                                      config["rope_theta"], rotary)
        if scaling is not None:
            config["rope_scaling"] = scaling
    return config


def llama3_rope_scaling(freq_factors: np.ndarray, theta: float, rotary_dim: int
                        ) -> dict[str, Any] | None:
    """transformers' `llama3` rope scaling from llama.cpp's `rope_freqs` (the divisor of
    each frequency), or None when they divide by 1. Raises ValueError when no llama3
    scaling gives these factors.

    llama3 divides low frequencies by `factor`, keeps high ones and blends between: the
    blend s = (old_ctx / wavelen - low) / (high - low) is linear in 1 / wavelen, so two
    blended frequencies fix it; low = 1 is chosen (any low gives the same factors).
    """
    f = np.asarray(freq_factors, dtype=np.float64)
    if np.allclose(f, 1.0, rtol=0, atol=1e-6):
        return None
    factor = float(f.max())
    inv_freq = 1.0 / theta ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    wavelen = 2 * math.pi / inv_freq
    blend = (1.0 / f - 1.0 / factor) / (1.0 - 1.0 / factor)  # s per frequency
    mid = (f > 1.0 + 1e-4) & (f < factor - 1e-4)
    candidates = [(1.0, 4.0, 8192.0)]  # Llama 3.1 / 3.2 / 3.3
    if mid.sum() >= 2:
        a, b = np.polyfit(1.0 / wavelen[mid], blend[mid], 1)  # s = a / wavelen + b
        if b < 0:
            high = 1.0 - 1.0 / b
            candidates.insert(0, (1.0, float(high), float(a * (high - 1.0))))
    elif mid.sum() == 1:  # low 1, high 4: the one blended frequency gives old_ctx
        i = int(np.argmax(mid))
        candidates.append((1.0, 4.0, float(wavelen[i] * (1.0 + 3.0 * blend[i]))))
    else:  # only kept and divided frequencies: any old_ctx between the two groups
        kept, divided = wavelen[f < 1.0 + 1e-4], wavelen[f > factor - 1e-4]
        if kept.size and divided.size:
            candidates.append((1.0, 4.0, float(4.0 * kept.max() + divided.min()) / 2.0))
    for low, high, old in candidates:
        old_ctx: float = round(old) if abs(old - round(old)) < 1e-3 * old else old
        scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                   "high_freq_factor": high, "original_max_position_embeddings": old_ctx}
        if np.allclose(_llama3_factors(scaling, wavelen), f, rtol=1e-4, atol=1e-5):
            return scaling
    raise ValueError("rope_freqs holds frequency factors that are not Llama 3's rope scaling")


def _llama3_factors(s: Mapping[str, Any], wavelen: np.ndarray) -> np.ndarray:
    """The divisor of each frequency under llama3 scaling (transformers' formula)."""
    old, low, high = s["original_max_position_embeddings"], s["low_freq_factor"], \
        s["high_freq_factor"]
    blend = np.clip((old / wavelen - low) / (high - low), 0.0, 1.0)
    scale = (1.0 - blend) / s["factor"] + blend  # 1 / divisor
    return 1.0 / scale
