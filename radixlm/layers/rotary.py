"""Rotary position embeddings (RoPE), with the scaling variants of Llama-family configs.

The inverse frequencies and the attention scaling of the scaled variants
(linear, llama3, yarn, longrope) come from transformers' `ROPE_INIT_FUNCTIONS`,
so a config means here what it means there; default and dynamic NTK are
computed here. `RotaryEmbedding` keeps a table of
cos/sin per position; the model looks its positions up once per forward and
every layer applies them with `apply_rotary`. A model with several kinds of
layers (Gemma 3: sliding and global) keeps one table per `layer_type`, each
from its own entry of `config.rope_parameters`. With a partial rotary factor
(Phi-4-mini) only the first `rotary_dim` features of each head rotate.

LongRoPE (Phi-3 / Phi-4-mini) has two sets of factors: transformers picks the
long ones while the sequence in hand is longer than
`original_max_position_embeddings`, so a prefix's keys would change with the
length of whatever follows it. Here the choice is made once, from the context
length served (`set_context_length`, the runner's `--context-length`, by
default `max_position_embeddings`): long factors when it exceeds the original
context, as vLLM and llama.cpp choose. This equals transformers' result for
every sequence of the chosen kind and keeps the prefix cache exact.

Rotation is the "neox" layout Hugging Face checkpoints use: the two halves of
each head's vector are the pairs being rotated (llama.cpp's interleaved layout
is undone when a GGUF file is converted).

Dynamic NTK: a position p inside `max_position_embeddings` uses the base
frequencies; a position beyond it uses the frequencies transformers computes
for a sequence of length p + 1. This equals transformers' result for every
sequence that fits the original context.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from radixlm.layers.cpu_kernels import use_fused_cpu_kernel


def rope_parameters(config: Any, layer_type: str | None = None) -> dict[str, Any]:
    """The config's RoPE parameters as one dict with `rope_type` and `rope_theta`.

    Reads transformers 5's `rope_parameters` (its entry for `layer_type` where the
    model has one per kind of layer) or the older `rope_scaling` + `rope_theta`.
    """
    params = getattr(config, "rope_parameters", None)
    if layer_type is not None:
        if not isinstance(params, dict) or not isinstance(params.get(layer_type), dict):
            raise ValueError(f"the config has no rope_parameters for {layer_type!r}")
        params = params[layer_type]
    if isinstance(params, dict) and "rope_theta" in params:
        out = dict(params)
    else:
        out = dict(getattr(config, "rope_scaling", None) or {})
        out["rope_theta"] = getattr(config, "rope_theta", 10000.0)
    out["rope_type"] = out.get("rope_type", out.get("type", "default"))
    return out


_STATIC_ROPE_TYPES = ("linear", "llama3", "yarn", "longrope")


def _default_inv_freq(base: float, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))  # [dim / 2]


class RotaryEmbedding(nn.Module):
    """A cos/sin table over positions for one head size.

    `forward(positions)` returns `(cos, sin)`, each [T, 1, rotary_dim / 2], in the
    requested dtype, ready for `apply_rotary` on [T, num_heads, head_dim] tensors.
    layer_type: which entry of `config.rope_parameters` (None: the only one).
    """

    def __init__(self, config: Any, head_dim: int, layer_type: str | None = None) -> None:
        super().__init__()
        params = rope_parameters(config, layer_type)
        self.config = config
        self.layer_type = layer_type
        self.rope_type: str = params["rope_type"]
        self.base = float(params["rope_theta"])
        factor = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
        self.rotary_dim = int(head_dim * float(factor or 1.0))
        self.max_position = int(getattr(config, "max_position_embeddings", 2048))
        self.dynamic_factor = float(params.get("factor", 1.0))
        self.original_max_position = int(params.get("original_max_position_embeddings")
                                          or self.max_position)
        self.long_rope = self.max_position > self.original_max_position  # longrope's choice
        inv_freq, self.attention_scaling = self._inv_freq()
        self.inv_freq: torch.Tensor
        inv_freq = inv_freq.to(torch.get_default_device())  # honours `with torch.device(...)`
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [rotary_dim / 2]
        self.cos_sin_cache: torch.Tensor
        self.register_buffer("cos_sin_cache", self._table(0, self.max_position), persistent=False)

    def _inv_freq(self) -> tuple[torch.Tensor, float]:
        if self.rope_type in ("default", "dynamic"):
            return _default_inv_freq(self.base, self.rotary_dim), 1.0
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        if self.rope_type not in _STATIC_ROPE_TYPES or self.rope_type not in ROPE_INIT_FUNCTIONS:
            raise NotImplementedError(f"rope_type {self.rope_type!r} is not supported")
        kwargs: dict[str, Any] = {"layer_type": self.layer_type} if self.layer_type else {}
        if self.rope_type == "longrope" and self.long_rope:
            kwargs["seq_len"] = self.original_max_position + 1  # the long factors
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[self.rope_type](self.config, "cpu", **kwargs)
        return inv_freq.float(), float(scaling)

    def set_context_length(self, context_len: int) -> None:
        """The longest sequence served: decides LongRoPE's factors (see the module
        docstring); other kinds of RoPE do not depend on it."""
        long_rope = context_len > self.original_max_position
        if self.rope_type != "longrope" or long_rope == self.long_rope:
            return
        self.long_rope = long_rope
        inv_freq, self.attention_scaling = self._inv_freq()
        self.inv_freq = inv_freq.to(self.inv_freq.device)
        self.cos_sin_cache = self._table(0, self.cos_sin_cache.shape[0])

    def _table(self, start: int, end: int) -> torch.Tensor:
        """cos | sin for positions [start, end): [end - start, rotary_dim] float32."""
        device = self.inv_freq.device
        pos = torch.arange(start, end, dtype=torch.float32, device=device)  # [P]
        inv_freq = self.inv_freq[None, :].expand(end - start, -1)  # [P, rotary_dim / 2]
        if self.rope_type == "dynamic":
            inv_freq = torch.where(
                (pos >= self.max_position)[:, None], self._dynamic_inv_freq(pos), inv_freq
            )
        freqs = pos[:, None] * inv_freq  # [P, rotary_dim / 2]
        return torch.cat([freqs.cos(), freqs.sin()], dim=-1) * self.attention_scaling

    def _dynamic_inv_freq(self, pos: torch.Tensor) -> torch.Tensor:
        """NTK-scaled frequencies for a sequence of length pos + 1: [P, rotary_dim / 2]."""
        dim, factor = self.rotary_dim, self.dynamic_factor
        seq_len = torch.clamp(pos + 1, min=self.max_position)  # [P]
        base = self.base * ((factor * seq_len / self.max_position) - (factor - 1)) ** (
            dim / (dim - 2)
        )  # [P]
        exponent = torch.arange(0, dim, 2, dtype=torch.float32, device=pos.device) / dim
        return 1.0 / (base[:, None] ** exponent[None, :])

    def _ensure_capacity(self, positions: torch.Tensor) -> None:
        # NOTE: checked on the CPU only: it reads a value, which would sync a GPU.
        if positions.device.type != "cpu" or positions.numel() == 0:
            return
        needed = int(positions.max()) + 1
        have = self.cos_sin_cache.shape[0]
        if needed > have:
            grown = max(needed, 2 * have)
            extra = self._table(have, grown).to(self.cos_sin_cache.device)
            self.cos_sin_cache = torch.cat([self.cos_sin_cache, extra], dim=0)

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self._ensure_capacity(positions)
        cos_sin = self.cos_sin_cache[positions].to(dtype)  # [T, rotary_dim]
        cos, sin = cos_sin.unsqueeze(1).chunk(2, dim=-1)  # each [T, 1, rotary_dim / 2]
        return cos, sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 fuse_float32: bool = False) -> torch.Tensor:
    """Rotate x [T, n, D] by cos/sin [T, 1, R / 2]; returns a new contiguous [T, n, D].

    R < D (a partial rotary factor): the first R features rotate, the rest pass.
    bfloat16/half on the CPU (float32 too with fuse_float32, see
    cpu_kernels.use_fused_cpu_kernel): one pass of the C++ kernel (torch's 7 operators)."""
    rotary_dim = 2 * cos.shape[-1]
    if rotary_dim < x.shape[-1]:
        rotated = apply_rotary(x[..., :rotary_dim], cos, sin)  # [T, n, R]
        return torch.cat([rotated, x[..., rotary_dim:]], dim=-1)
    if (use_fused_cpu_kernel(x, fuse_float32) and x.stride(2) == 1 and x.stride(1) == x.shape[2]
            and cos.dtype == x.dtype):
        return torch.ops.radixlm.rotary_embedding(x, cos, sin)
    x1, x2 = x.chunk(2, dim=-1)  # each [T, n, D / 2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
