"""Llama-family decoder models: Llama (and SmolLM2), Mistral, Qwen2.

One implementation; the architectures differ only in config values and in
which projections carry a bias (Qwen2: q/k/v; Llama: all four attention
projections when `attention_bias`, the MLP when `mlp_bias`).

Checkpoints load by Hugging Face names: q_proj/k_proj/v_proj go into one
fused `qkv_proj` and gate_proj/up_proj into one `gate_up_proj`, so each layer
runs two matmuls fewer. With tensor parallelism each rank builds its shard
(its heads, its part of the MLP and of the vocabulary: `tp_rank_size()`), and
the layers' loaders copy only that part of each checkpoint tensor. Sliding-window attention (Mistral, some Qwen2
configs) is not implemented: attention covers the whole sequence, which is
exact for sequences no longer than the window.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch
from torch import nn

from radixlm.distributed.parallel_state import tp_rank_size
from radixlm.layers.activation import SiluAndMul
from radixlm.layers.layernorm import RMSNorm
from radixlm.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    get_weight_loader,
)
from radixlm.layers.rotary import RotaryEmbedding, apply_rotary
from radixlm.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding
from radixlm.model_executor.forward_batch import ForwardBatch
from radixlm.models.base import CausalLM
from radixlm.models.layer_stack import stack_for

logger = logging.getLogger(__name__)

# (fused parameter, Hugging Face projection, shard id)
_STACKED_PARAMS: list[tuple[str, str, str | int]] = [
    ("qkv_proj", "q_proj", "q"),
    ("qkv_proj", "k_proj", "k"),
    ("qkv_proj", "v_proj", "v"),
    ("gate_up_proj", "gate_proj", 0),
    ("gate_up_proj", "up_proj", 1),
]


class Biases(NamedTuple):
    """Which projections carry a bias."""

    qkv: bool = False
    o: bool = False
    mlp: bool = False


def _head_dim(config: Any) -> int:
    return int(
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )


class LlamaMLP(nn.Module):
    def __init__(self, config: Any, dtype: torch.dtype, bias: bool) -> None:
        super().__init__()
        if getattr(config, "hidden_act", "silu") != "silu":
            raise NotImplementedError(f"hidden_act {config.hidden_act!r} is not supported")
        inter = config.intermediate_size
        tp_rank, tp_size = tp_rank_size()
        self.gate_up_proj = MergedColumnParallelLinear(
            config.hidden_size, [inter, inter], bias=bias, params_dtype=dtype,
            tp_rank=tp_rank, tp_size=tp_size,
        )
        self.down_proj = RowParallelLinear(inter, config.hidden_size, bias=bias, params_dtype=dtype,
                                           tp_rank=tp_rank, tp_size=tp_size)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # [T, 2 * inter]
        return self.down_proj(self.act_fn(gate_up))  # [T, hidden]


class LlamaAttention(nn.Module):
    fuse_float32 = False  # float32 rotary through the fused kernel (bf16_weights)

    def __init__(self, config: Any, layer_id: int, dtype: torch.dtype, biases: Biases) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.head_dim = _head_dim(config)
        num_kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        tp_rank, tp_size = tp_rank_size()
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            self.head_dim,
            config.num_attention_heads,
            num_kv_heads,
            bias=biases.qkv,
            params_dtype=dtype,
            tp_rank=tp_rank,
            tp_size=tp_size,
        )
        self.num_heads = self.qkv_proj.num_heads  # this rank's
        self.num_kv_heads = self.qkv_proj.num_kv_heads  # this rank's
        self.qk_size = self.qkv_proj.q_size + self.qkv_proj.kv_size
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * self.head_dim, config.hidden_size, bias=biases.o,
            params_dtype=dtype, tp_rank=tp_rank, tp_size=tp_size,
        )

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        backend = forward_batch.attn_backend
        assert backend is not None, "ForwardBatch.attn_backend is not set"
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)  # [T, (H + 2 * Hkv) * D]
        qk = qkv[:, : self.qk_size].view(num_tokens, -1, self.head_dim)  # [T, H + Hkv, D]
        qk = apply_rotary(qk, cos, sin, self.fuse_float32)  # [T, H + Hkv, D]
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)  # [T, H, D], [T, Hkv, D]
        v = qkv[:, self.qk_size :].view(num_tokens, self.num_kv_heads, self.head_dim)
        out = backend.forward(q, k, v, self.layer_id, forward_batch)  # [T, H * D]
        return self.o_proj(out)  # [T, hidden]


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: Any, layer_id: int, dtype: torch.dtype, biases: Biases) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, dtype)
        self.self_attn = LlamaAttention(config, layer_id, dtype, biases)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, dtype)
        self.mlp = LlamaMLP(config, dtype, biases.mlp)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        forward_batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden, residual) → (mlp output, residual stream); the next norm adds them."""
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm.add_and_norm(hidden, residual)
        hidden = self.self_attn(hidden, cos, sin, forward_batch)
        hidden, residual = self.post_attention_layernorm.add_and_norm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, config: Any, dtype: torch.dtype, biases: Biases) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, dtype,
                                                   *tp_rank_size())
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, dtype, biases) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.rotary_emb = RotaryEmbedding(config, _head_dim(config))
        self.use_layer_stack = True  # False: always the Python loop (tests compare the two)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        forward_batch: ForwardBatch,
        input_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if input_embeds is None:
            input_embeds = self.embed_tokens(input_ids)
        hidden = input_embeds  # [T, hidden]
        cos, sin = self.rotary_emb(positions, hidden.dtype)  # each [T, 1, D / 2]
        residual: torch.Tensor | None = None
        stack = stack_for(self) if hidden.device.type == "cpu" and self.use_layer_stack else None
        out = stack.run(hidden, cos, sin, forward_batch) if stack is not None else None
        if out is not None:  # every layer in one C++ call (models/layer_stack.py)
            hidden, residual = out
        else:
            for layer in self.layers:
                hidden, residual = layer(hidden, residual, cos, sin, forward_batch)
        if residual is None:
            return self.norm(hidden)
        return self.norm.add_and_norm(hidden, residual)[0]  # [T, hidden]


class LlamaForCausalLM(CausalLM):
    """A Llama-family causal LM. `forward` returns final-normed hidden states [T, hidden];
    `compute_logits` turns selected rows into float32 logits."""

    def __init__(self, config: Any, dtype: torch.dtype | None = None) -> None:
        super().__init__(config, dtype)
        dtype = dtype or torch.get_default_dtype()
        self.model = LlamaModel(config, dtype, self.biases(config))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, dtype,
                                      *tp_rank_size())
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if self.tie_word_embeddings:
            self.lm_head.tie_to(self.model.embed_tokens)
        _warn_sliding_window(config)

    @staticmethod
    def biases(config: Any) -> Biases:
        attention_bias = bool(getattr(config, "attention_bias", False))
        return Biases(attention_bias, attention_bias, bool(getattr(config, "mlp_bias", False)))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        forward_batch: ForwardBatch,
        input_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, positions [T] (or input_embeds [T, hidden]) → hidden states [T, hidden]
        (final norm applied). Writes this step's K/V into the pool through
        `forward_batch.attn_backend`."""
        return self.model(input_ids, positions, forward_batch, input_embeds)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [T] (each < vocab_size) → token embeddings [T, hidden]."""
        return self.model.embed_tokens(input_ids)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [M, hidden] → float32 logits [M, vocab_size]."""
        return self.lm_head.compute_logits(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load Hugging Face-named tensors; raises on an unknown name or a missing weight."""

        def rename(name: str) -> str | None:
            if self.tie_word_embeddings and name == "lm_head.weight":
                return "model.embed_tokens.weight"  # the same tensor
            return name

        load_llama_weights(self, weights, rename)


def load_llama_weights(module: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                       rename: Callable[[str], str | None]) -> None:
    """Copy Hugging Face-named tensors into `module`, fusing q/k/v and gate/up.

    `rename` maps a checkpoint name to the module's (None skips the tensor).
    Raises ValueError on a name that matches no parameter, a shape that differs,
    or a parameter the checkpoint lacks.
    """
    params = dict(module.named_parameters())
    loaded: set[str] = set()
    for hf_name, tensor in weights:
        if "rotary_emb.inv_freq" in hf_name:
            continue
        name = rename(hf_name)
        if name is None:
            continue
        for fused, hf_proj, shard_id in _STACKED_PARAMS:
            if f".{hf_proj}." in name:
                name = name.replace(f".{hf_proj}.", f".{fused}.")
                get_weight_loader(_param(params, name))(params[name], tensor, shard_id)
                break
        else:
            get_weight_loader(_param(params, name))(params[name], tensor)
        loaded.add(name)
    missing = sorted(set(params) - loaded)
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} weights, e.g. {missing[:5]}")


def _param(params: dict[str, nn.Parameter], name: str) -> nn.Parameter:
    if name not in params:
        raise ValueError(f"checkpoint weight {name!r} matches no parameter of the model")
    return params[name]


class MistralForCausalLM(LlamaForCausalLM):
    @staticmethod
    def biases(config: Any) -> Biases:
        return Biases()


class Qwen2ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def biases(config: Any) -> Biases:
        return Biases(qkv=True)


def _warn_sliding_window(config: Any) -> None:
    window = getattr(config, "sliding_window", None)
    if not window or not getattr(config, "use_sliding_window", True):
        return
    if window < getattr(config, "max_position_embeddings", 0):
        logger.warning(
            "sliding_window=%d is not implemented: attention spans the whole sequence, "
            "which differs from the reference beyond %d tokens",
            window,
            window,
        )
