"""The decoder blocks every family is made of: one definition, declared per family.

A family module (llama.py, qwen3.py, gemma3.py, phi3.py, smollm3.py) does not
write a decoder again. It declares, from the config:

- a `DecoderArch`, what all its layers share: plain or Gemma (1 + w) RMSNorm,
  per-head q/k norms (Qwen3, Gemma 3), Gemma's "sandwich" norms around
  attention and MLP, the MLP activation, which projections carry a bias, the
  embedding scale (Gemma: sqrt(hidden)) and a final logit softcap;
- a `LayerSpec` per layer: its attention options (softmax scale, sliding
  window, logit softcap; see layers/attention.py), which rotary table it uses
  (one per kind of layer: Gemma 3's sliding and global layers have their own
  bases) or none (SmolLM3's NoPE layers), and whether its MLP is sparse (MoE);

and `DecoderModel` builds and runs the stack. Checkpoints load by Hugging
Face names (decoder_weights.py): q/k/v go into one fused `qkv_proj` and
gate/up into one `gate_up_proj`, so each layer runs two matmuls fewer; with
tensor parallelism each rank builds its shard and the layers' loaders copy
only that part.

Each layer is a program of kernel calls (models/layer_program.py), written
here once from the arch and spec: `DecoderLayer.forward` runs it in Python, and
on the CPU the whole stack of programs runs in one C++ call
(models/layer_stack.py), with the same results bit for bit. A layer the C++
loop cannot run (e.g. a weight format without a C++ kernel) keeps the model in
the Python loop, and the start-up log says which and why
(`layer_stack.fast_path_report`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import nn

from radixlm.distributed.parallel_state import tp_rank_size
from radixlm.layers.activation import gated_activation
from radixlm.layers.attention import PLAIN_ATTENTION, AttnOptions
from radixlm.layers.layernorm import RMSNorm
from radixlm.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from radixlm.layers.rotary import RotaryEmbedding
from radixlm.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding
from radixlm.model_executor.forward_batch import ForwardBatch
from radixlm.models.base import CausalLM
from radixlm.models.decoder_weights import load_decoder_weights
from radixlm.models.layer_program import (
    HIDDEN,
    LayerProgram,
    ProgramBuilder,
    StepContext,
)
from radixlm.models.layer_stack import stack_for

DEFAULT_ROPE = "default"


class Biases(NamedTuple):
    """Which projections carry a bias."""

    qkv: bool = False
    o: bool = False
    mlp: bool = False


@dataclass(frozen=True)
class DecoderArch:
    """What every layer of a family has (see the module docstring)."""

    biases: Biases = field(default_factory=Biases)
    qk_norm: bool = False  # RMSNorm over each head of q and k, before the rotary
    norm: type[RMSNorm] = RMSNorm  # GemmaRMSNorm: (1 + w)
    sandwich_norms: bool = False  # Gemma: norms after attention and around the MLP
    activation: str = "silu"
    embed_scale: bool = False  # embeddings times sqrt(hidden_size)
    final_logit_softcap: float | None = None


@dataclass(frozen=True)
class LayerSpec:
    """What one layer does beyond the family's arch."""

    attn: AttnOptions = PLAIN_ATTENTION
    rope: str | None = DEFAULT_ROPE  # the rotary table (a rope_parameters layer type); None: NoPE
    sparse_mlp: bool = False  # a mixture of experts (the family builds it)


def head_dim(config: Any) -> int:
    return int(
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )


def sliding_windows(config: Any) -> list[int | None]:
    """Each layer's sliding window, as transformers reads the config: `layer_types` where
    the config has them, else `sliding_window` on every layer (Mistral, Phi-3).

    A window at least `max_position_embeddings` long never hides a key: None."""
    num_layers = int(config.num_hidden_layers)
    window = getattr(config, "sliding_window", None)
    if not window or getattr(config, "use_sliding_window", True) is False:
        return [None] * num_layers
    if int(window) >= int(getattr(config, "max_position_embeddings", 0) or 0) > 0:
        return [None] * num_layers
    types = getattr(config, "layer_types", None)
    if types is None:
        return [int(window)] * num_layers
    return [int(window) if t == "sliding_attention" else None for t in types]


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)), gate and up fused into one matmul."""

    def __init__(self, hidden_size: int, intermediate_size: int, dtype: torch.dtype,
                 activation: str = "silu", bias: bool = False, reduce_results: bool = True,
                 ) -> None:
        super().__init__()
        tp_rank, tp_size = tp_rank_size()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size] * 2, bias=bias, params_dtype=dtype,
            tp_rank=tp_rank, tp_size=tp_size)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias,
                                           params_dtype=dtype, tp_rank=tp_rank, tp_size=tp_size,
                                           reduce_results=reduce_results)
        self.activation = activation
        self.act_fn = gated_activation(activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # [T, 2 * inter]
        return self.down_proj(self.act_fn(gate_up))  # [T, hidden]

    def program(self, b: ProgramBuilder, x: int, out: int | None = None) -> int:
        """`forward` as layer-program instructions, x → the output register."""
        gate_up = b.linear(x, self.gate_up_proj)  # [T, 2 * inter]
        return b.linear(b.gated_act(gate_up, self.act_fn), self.down_proj, out)  # [T, hidden]


class DecoderAttention(nn.Module):
    fuse_float32 = False  # float32 rotary through the fused kernel (bf16_weights)

    def __init__(self, config: Any, layer_id: int, dtype: torch.dtype, arch: DecoderArch,
                 spec: LayerSpec) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.head_dim = head_dim(config)
        # (the shared plain options: backends test `is PLAIN_ATTENTION` first)
        self.attn_options = PLAIN_ATTENTION if spec.attn == PLAIN_ATTENTION else spec.attn
        num_kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        tp_rank, tp_size = tp_rank_size()
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, self.head_dim, config.num_attention_heads, num_kv_heads,
            bias=arch.biases.qkv, params_dtype=dtype, tp_rank=tp_rank, tp_size=tp_size)
        self.num_heads = self.qkv_proj.num_heads  # this rank's
        self.num_kv_heads = self.qkv_proj.num_kv_heads  # this rank's
        self.q_size = self.qkv_proj.q_size
        self.qk_size = self.qkv_proj.q_size + self.qkv_proj.kv_size
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * self.head_dim, config.hidden_size, bias=arch.biases.o,
            params_dtype=dtype, tp_rank=tp_rank, tp_size=tp_size)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if arch.qk_norm:
            self.q_norm = arch.norm(self.head_dim, config.rms_norm_eps, dtype)
            self.k_norm = arch.norm(self.head_dim, config.rms_norm_eps, dtype)

    def program(self, b: ProgramBuilder, x: int, rope: str | None,
                out: int | None = None) -> int:
        """Attention as layer-program instructions, x → the output register: qkv, q/k
        norms, rotary (`rope`: the table; None: NoPE), attention with K/V stored, o."""
        d = self.head_dim
        qkv = b.linear(x, self.qkv_proj)  # [T, (H + 2 * Hkv) * D]
        if self.q_norm is None or self.k_norm is None:
            qk = b.columns(qkv, 0, self.qk_size, d)  # [T, H + Hkv, D]
            if rope is not None:
                qk = b.rope(qk, rope, self)
            q, k = b.heads(qk, 0, self.num_heads), b.heads(qk, self.num_heads, self.num_kv_heads)
        else:
            q = b.norm(b.columns(qkv, 0, self.q_size, d), self.q_norm)  # [T, H, D]
            k = b.norm(b.columns(qkv, self.q_size, self.qk_size - self.q_size, d),
                       self.k_norm)  # [T, Hkv, D]
            if rope is not None:
                q, k = b.rope(q, rope, self), b.rope(k, rope, self)
        v = b.columns(qkv, self.qk_size, self.qk_size - self.q_size, d)  # [T, Hkv, D]
        attn = b.attention(q, k, v, self.layer_id, self.attn_options, d)  # [T, H * D]
        return b.linear(attn, self.o_proj, out)  # [T, hidden]


class DecoderLayer(nn.Module):
    def __init__(self, config: Any, layer_id: int, dtype: torch.dtype, arch: DecoderArch,
                 spec: LayerSpec, mlp: nn.Module) -> None:
        super().__init__()
        eps, hidden = config.rms_norm_eps, config.hidden_size
        self.rope = spec.rope
        self.input_layernorm = arch.norm(hidden, eps, dtype)
        self.self_attn = DecoderAttention(config, layer_id, dtype, arch, spec)
        self.post_attention_layernorm = arch.norm(hidden, eps, dtype)
        self.sandwich = arch.sandwich_norms
        if self.sandwich:
            self.pre_feedforward_layernorm = arch.norm(hidden, eps, dtype)
            self.post_feedforward_layernorm = arch.norm(hidden, eps, dtype)
        self.mlp = mlp
        self.program = self.build_program()

    def build_program(self) -> LayerProgram:
        """The layer's kernel calls: pre-norm attention and MLP around the residual
        stream, with Gemma's norms after attention and around the MLP where set."""
        b = ProgramBuilder()
        h = b.add_norm(HIDDEN, self.input_layernorm, out=HIDDEN)
        h = self.self_attn.program(b, h, self.rope, out=HIDDEN)
        mlp: Any = self.mlp  # GatedMLP or SparseMoeBlock: both write their program
        if not self.sandwich:
            h = b.add_norm(h, self.post_attention_layernorm, out=HIDDEN)
            mlp.program(b, h, out=HIDDEN)
            return b.build()
        h = b.norm(h, self.post_attention_layernorm, out=HIDDEN)
        h = b.add_norm(h, self.pre_feedforward_layernorm, out=HIDDEN)
        b.norm(mlp.program(b, h), self.post_feedforward_layernorm, out=HIDDEN)
        return b.build()

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None,
                ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden, residual) → (last block's output, residual stream); the next norm adds
        them (a fused add-and-norm). Runs the layer's program in Python."""
        return self.program.run(hidden, residual, ctx)


MlpFactory = Callable[[int, LayerSpec], nn.Module]  # (layer_id, spec) → the layer's MLP


class DecoderModel(nn.Module):
    """Embedding, decoder layers, final norm. `forward` returns final-normed hidden states."""

    def __init__(self, config: Any, dtype: torch.dtype, arch: DecoderArch,
                 specs: list[LayerSpec], make_mlp: MlpFactory | None = None) -> None:
        super().__init__()
        if len(specs) != config.num_hidden_layers:
            raise ValueError(f"{len(specs)} layer specs for {config.num_hidden_layers} layers")
        make_mlp = make_mlp or (lambda layer_id, spec: GatedMLP(
            config.hidden_size, config.intermediate_size, dtype, arch.activation,
            arch.biases.mlp))
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, dtype,
                                                   *tp_rank_size())
        self.embed_scale = float(config.hidden_size) ** 0.5 if arch.embed_scale else None
        self.layers = nn.ModuleList(DecoderLayer(config, i, dtype, arch, spec, make_mlp(i, spec))
                                    for i, spec in enumerate(specs))
        self.norm = arch.norm(config.hidden_size, config.rms_norm_eps, dtype)
        tables = sorted({s.rope for s in specs if s.rope is not None})
        self.rotary = nn.ModuleDict({
            name: RotaryEmbedding(config, head_dim(config),
                                  layer_type=None if name == DEFAULT_ROPE else name)
            for name in tables})
        self.use_layer_stack = True  # False: always the Python loop (tests compare the two)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [T] → embeddings [T, hidden] (scaled where the family scales them)."""
        embeds = self.embed_tokens(input_ids)
        if self.embed_scale is None:
            return embeds
        return embeds * torch.tensor(self.embed_scale, dtype=embeds.dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                forward_batch: ForwardBatch, input_embeds: torch.Tensor | None = None,
                ) -> torch.Tensor:
        hidden = self.embed(input_ids) if input_embeds is None else input_embeds  # [T, hidden]
        ropes = {name: table(positions, hidden.dtype) for name, table in self.rotary.items()}
        residual: torch.Tensor | None = None
        stack = stack_for(self) if hidden.device.type == "cpu" and self.use_layer_stack else None
        out = stack.run(hidden, ropes, forward_batch) if stack is not None else None
        if out is not None:  # every layer in one C++ call (models/layer_stack.py)
            hidden, residual = out
        else:
            ctx = StepContext(ropes, forward_batch)
            for layer in self.layers:
                hidden, residual = layer(hidden, residual, ctx)
        if residual is None:
            return self.norm(hidden)
        return self.norm.add_and_norm(hidden, residual)[0]  # [T, hidden]


class DecoderForCausalLM(CausalLM):
    """A decoder LM declared by `arch` and `layer_specs` (see the module docstring).
    `forward` returns final-normed hidden states [T, hidden]; `compute_logits` turns
    selected rows into float32 logits."""

    def __init__(self, config: Any, dtype: torch.dtype | None = None) -> None:
        super().__init__(config, dtype)
        dtype = dtype or torch.get_default_dtype()
        arch = self.arch(config)
        self.model = DecoderModel(config, dtype, arch, self.layer_specs(config),
                                  lambda layer_id, spec: self.make_mlp(config, layer_id, spec,
                                                                       dtype, arch))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, dtype,
                                      *tp_rank_size())
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if self.tie_word_embeddings:
            self.lm_head.tie_to(self.model.embed_tokens)
        self.final_logit_softcap = arch.final_logit_softcap

    # ---- what a family declares

    @classmethod
    def arch(cls, config: Any) -> DecoderArch:
        return DecoderArch()

    @classmethod
    def layer_specs(cls, config: Any) -> list[LayerSpec]:
        return [LayerSpec(AttnOptions(sliding_window=w)) for w in sliding_windows(config)]

    def make_mlp(self, config: Any, layer_id: int, spec: LayerSpec, dtype: torch.dtype,
                 arch: DecoderArch) -> nn.Module:
        return GatedMLP(config.hidden_size, config.intermediate_size, dtype, arch.activation,
                        arch.biases.mlp)

    # ---- the CausalLM interface

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                forward_batch: ForwardBatch, input_embeds: torch.Tensor | None = None,
                ) -> torch.Tensor:
        """input_ids, positions [T] (or input_embeds [T, hidden]) → hidden states [T, hidden]
        (final norm applied). Writes this step's K/V into the pool through
        `forward_batch.attn_backend`."""
        return self.model(input_ids, positions, forward_batch, input_embeds)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [T] (each < vocab_size) → token embeddings [T, hidden]."""
        return self.model.embed(input_ids)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [M, hidden] → float32 logits [M, vocab_size]."""
        logits = self.lm_head.compute_logits(hidden)
        cap = self.final_logit_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)

    def set_context_length(self, context_len: int) -> None:
        for table in self.model.rotary.values():
            assert isinstance(table, RotaryEmbedding)
            table.set_context_length(context_len)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load Hugging Face-named tensors; raises on an unknown name or a missing weight."""

        def rename(name: str) -> str | None:
            if self.tie_word_embeddings and name == "lm_head.weight":
                return "model.embed_tokens.weight"  # the same tensor
            return name

        load_decoder_weights(self, weights, rename)
