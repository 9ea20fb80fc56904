"""Rotary position embeddings (RoPE), with the scaling variants of Llama-family configs.

The inverse frequencies and the attention scaling of the scaled variants
(linear, llama3, yarn) come from transformers' `ROPE_INIT_FUNCTIONS`, so a
config means here what it means there; default and dynamic NTK are computed
here. `RotaryEmbedding` keeps a table of
cos/sin per position; the model looks its positions up once per forward and
every layer applies them with `apply_rotary`.

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


def rope_parameters(config: Any) -> dict[str, Any]:
    """The config's RoPE parameters as one dict with `rope_type` and `rope_theta`.

    Reads transformers 5's `rope_parameters` or the older `rope_scaling` + `rope_theta`.
    """
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        out = dict(params)
    else:
        out = dict(getattr(config, "rope_scaling", None) or {})
        out["rope_theta"] = getattr(config, "rope_theta", 10000.0)
    out["rope_type"] = out.get("rope_type", out.get("type", "default"))
    return out


_STATIC_ROPE_TYPES = ("linear", "llama3", "yarn")


def _default_inv_freq(base: float, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))  # [dim / 2]


class RotaryEmbedding(nn.Module):
    """A cos/sin table over positions for one head size.

    `forward(positions)` returns `(cos, sin)`, each [T, 1, rotary_dim / 2], in the
    requested dtype, ready for `apply_rotary` on [T, num_heads, head_dim] tensors.
    """

    def __init__(self, config: Any, head_dim: int) -> None:
        super().__init__()
        params = rope_parameters(config)
        self.config = config
        self.rope_type: str = params["rope_type"]
        self.base = float(params["rope_theta"])
        self.rotary_dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
        if self.rotary_dim != head_dim:
            raise NotImplementedError("partial rotary embeddings are not supported")
        self.max_position = int(getattr(config, "max_position_embeddings", 2048))
        self.dynamic_factor = float(params.get("factor", 1.0))
        inv_freq, self.attention_scaling = self._inv_freq(config)
        self.inv_freq: torch.Tensor
        inv_freq = inv_freq.to(torch.get_default_device())  # honours `with torch.device(...)`
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [rotary_dim / 2]
        self.cos_sin_cache: torch.Tensor
        self.register_buffer("cos_sin_cache", self._table(0, self.max_position), persistent=False)

    def _inv_freq(self, config: Any) -> tuple[torch.Tensor, float]:
        if self.rope_type in ("default", "dynamic"):
            return _default_inv_freq(self.base, self.rotary_dim), 1.0
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        # NOTE: longrope switches frequencies with the sequence length: not a static table.
        if self.rope_type not in _STATIC_ROPE_TYPES or self.rope_type not in ROPE_INIT_FUNCTIONS:
            raise NotImplementedError(f"rope_type {self.rope_type!r} is not supported")
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[self.rope_type](config, "cpu")
        return inv_freq.float(), float(scaling)

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
    """Rotate x [T, n, D] by cos/sin [T, 1, D / 2]; returns a new contiguous [T, n, D].

    bfloat16/half on the CPU (float32 too with fuse_float32, see
    cpu_kernels.use_fused_cpu_kernel): one pass of the C++ kernel (torch's 7 operators)."""
    if (use_fused_cpu_kernel(x, fuse_float32) and x.stride(2) == 1 and x.stride(1) == x.shape[2]
            and cos.dtype == x.dtype):
        return torch.ops.radixlm.rotary_embedding(x, cos, sin)
    x1, x2 = x.chunk(2, dim=-1)  # each [T, n, D / 2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
