"""Attention backends: the interface, the registry, and the torch-native backend.

A backend owns how attention reads the KV pool. Per forward pass the model
runner calls `init_forward_metadata(batch)` once; then every attention layer
calls `forward(q, k, v, layer_id, batch)`, which writes this step's k and v
into the pool at `batch.out_cache_loc` and attends each request's new tokens
over its whole sequence: the cached prefix (read through
`req_to_token[req_pool_indices[i], :prefix_len]`) and, causally, its own new
tokens.

`TorchNativeAttnBackend` (CPU and CUDA, no custom kernels):
- Decoding requests (one new token each) are batched: one padded gather of
  their KV [B, max_len] (padding points at dummy slot 0 and is masked out) and
  one `scaled_dot_product_attention`.
- Extending requests (prefill chunks, jump-forward runs) go one by one
  (`extend_attention`): with no prefix, plain causal attention over the new
  k, v; with a prefix on the CPU, two flash-attention calls (the gathered
  prefix unmasked, the new tokens causally) merged by their log-sum-exp, so
  a chunk after a cached prefix takes the fast causal path too; elsewhere the
  whole sequence is gathered and a causal mask shifted by the prefix applies.
- Index tensors and masks are built once per forward and shared by all layers.
- Grouped-query attention uses SDPA's `enable_gqa` (no repeated K/V copies).
- A layer passes its `AttnOptions`: the softmax scale (default head_dim^-0.5),
  a sliding window and a logit softcap. Layers with a window or a softcap go
  through attention_masked.py (a window's keys only, a mask per request).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.layers.attention_masked import MaskedPlans, masked_attention
from radixlm.mem_cache.kv_format import gather_rows
from radixlm.utils import resolve_lazy

if TYPE_CHECKING:
    from radixlm.model_executor.forward_batch import ForwardBatch


@dataclass(frozen=True)
class AttnOptions:
    """What one attention layer asks beyond causal softmax(q k^T / sqrt(head_dim)) v.

    scale: the softmax scale (None: head_dim ** -0.5; Gemma: query_pre_attn_scalar ** -0.5).
    sliding_window: a query at position p sees keys at positions > p - sliding_window
    (transformers' definition); None: the whole sequence.
    logit_softcap: scores → cap * tanh(scores / cap) before the mask (Gemma 2 style).
    """

    scale: float | None = None
    sliding_window: int | None = None
    logit_softcap: float | None = None

    @property
    def needs_mask(self) -> bool:
        """Whether the layer needs the masked path (attention_masked.py)."""
        return self.sliding_window is not None or self.logit_softcap is not None

    def scale_for(self, head_dim: int) -> float:
        return self.scale if self.scale is not None else head_dim**-0.5

    def describe(self) -> str:
        parts = [f"sliding window {self.sliding_window}" if self.sliding_window else "",
                 f"logit softcap {self.logit_softcap}" if self.logit_softcap else ""]
        return ", ".join(p for p in parts if p) or "plain"


PLAIN_ATTENTION = AttnOptions()


def masked_layers(model: Any) -> dict[str, list[int]]:
    """The layers of `model` whose AttnOptions need the masked path, by what they ask
    (e.g. {"sliding window 512": [0, 1, 2, 3, 4]}); attention modules carry `layer_id`
    and `attn_options`."""
    found: dict[str, list[int]] = {}
    for module in model.modules() if model is not None else ():
        options = getattr(module, "attn_options", None)
        if isinstance(options, AttnOptions) and options.needs_mask:
            found.setdefault(options.describe(), []).append(int(module.layer_id))
    return found


class AttentionBackend(ABC):
    """How attention layers store K/V in the pool and attend over it."""

    def __init__(self, model: nn.Module | None = None) -> None:
        self.model = model

    @abstractmethod
    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        """Precompute what every layer of this forward shares; stores it in
        `forward_batch.attn_metadata`. Called once per forward, before the model runs."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        forward_batch: ForwardBatch,
        options: AttnOptions = PLAIN_ATTENTION,
    ) -> torch.Tensor:
        """Attention of one layer. q [T, H, D], k and v [T, Hkv, D] → [T, H * D].

        Writes k, v into the pool at `forward_batch.out_cache_loc` (modifies the pool),
        then attends each request's tokens over its prefix and, causally, its new tokens,
        as `options` says (scale, sliding window, logit softcap). A backend that cannot
        run some option itself must still compute it exactly (attention_masked.py).
        """


# Name → class, or a "module:Class" string imported on first use.
_BACKENDS: dict[str, str | type[AttentionBackend]] = {
    "cpu_paged": "radixlm.layers.cpu_attention:CpuPagedAttnBackend",
}


def register_attention_backend(
    name: str,
) -> Callable[[type[AttentionBackend]], type[AttentionBackend]]:
    """Class decorator: make a backend available to `create_attention_backend(name)`."""

    def wrap(cls: type[AttentionBackend]) -> type[AttentionBackend]:
        _BACKENDS[name] = cls
        return cls

    return wrap


def attention_backend_names() -> list[str]:
    return sorted(_BACKENDS)


def create_attention_backend(name: str, model: nn.Module | None = None) -> AttentionBackend:
    """A new backend by registered name (e.g. "torch_native")."""
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; available: {sorted(_BACKENDS)}")
    cls: type[AttentionBackend] = resolve_lazy(_BACKENDS[name])
    return cls(model)


@dataclass
class _DecodeGroup:
    rows: torch.Tensor | None  # [Bd] token rows of the batch; None: all rows, in order
    kv_index: torch.Tensor  # [Bd * max_len] KV slots, request-major, padding → slot 0
    max_len: int
    mask: torch.Tensor | None  # [Bd, 1, 1, max_len] bool (True = attend); None: no padding


@dataclass
class ExtendReq:
    """One extending request of a batch, as `extend_attention` reads it."""

    start: int  # token rows [start, end) of the batch
    end: int
    prefix_index: torch.Tensor | None  # [prefix] KV slots of the cached prefix; None: no prefix
    mask: torch.Tensor | None  # [extend, prefix + extend] bool, only where there is no
    # flash kernel with a log-sum-exp (off the CPU); None: plain causal or the split path


def extend_request(fb: ForwardBatch, i: int, pool_row: int, start: int) -> ExtendReq:
    """Metadata of batch item i, which extends by more than one token."""
    n, prefix_len = fb.extend_lens[i], fb.prefix_lens[i]
    if prefix_len == 0:
        return ExtendReq(start, start + n, None, None)
    prefix_index = fb.req_to_token[pool_row, :prefix_len]  # [prefix]
    mask = None
    if not _has_cpu_flash(fb.input_ids.device):
        device = fb.input_ids.device
        key_pos = torch.arange(prefix_len + n, device=device)
        query_pos = torch.arange(prefix_len, prefix_len + n, device=device)
        mask = key_pos[None, :] <= query_pos[:, None]  # [n, prefix + n]
    return ExtendReq(start, start + n, prefix_index, mask)


def _has_cpu_flash(device: torch.device) -> bool:
    return device.type == "cpu" and hasattr(
        torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"
    )


def extend_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    ext: ExtendReq,
    scale: float | None = None,
) -> torch.Tensor:
    """One request's new tokens over its prefix and, causally, themselves → [n, H, D].

    q [T, H, D], k and v [T, Hkv, D] (this step's, rows ext.start:ext.end, as the pool
    reads them back: `stored_kv`); k_buf, v_buf [slots, Hkv, row] (the pool as stored,
    read for the prefix only); scale: the softmax scale (None: head_dim ** -0.5).
    """
    q_req = q[ext.start : ext.end].transpose(0, 1)  # [H, n, D]
    keys = k[ext.start : ext.end].to(q.dtype).transpose(0, 1)  # [Hkv, n, D]
    values = v[ext.start : ext.end].to(q.dtype).transpose(0, 1)  # [Hkv, n, D]
    if ext.prefix_index is None:
        out = F.scaled_dot_product_attention(
            q_req, keys, values, is_causal=True, scale=scale, enable_gqa=True
        )  # [H, n, D]
        return out.transpose(0, 1)
    prefix_k = gather_rows(k_buf, ext.prefix_index, q.dtype, q.shape[-1]).transpose(0, 1)
    prefix_v = gather_rows(v_buf, ext.prefix_index, q.dtype, q.shape[-1]).transpose(0, 1)
    # prefix_k, prefix_v: [Hkv, prefix, D]
    if ext.mask is not None:
        out = F.scaled_dot_product_attention(
            q_req,
            torch.cat([prefix_k, keys], dim=1),
            torch.cat([prefix_v, values], dim=1),
            attn_mask=ext.mask,
            scale=scale,
            enable_gqa=True,
        )  # [H, n, D]
        return out.transpose(0, 1)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    out_p, lse_p = flash(q_req[None], prefix_k[None], prefix_v[None], 0.0, False, scale=scale)
    out_n, lse_n = flash(q_req[None], keys[None], values[None], 0.0, True, scale=scale)
    # out_*: [1, H, n, D]; lse_*: [1, H, n] float32. Merge the two softmax halves.
    lse = torch.logaddexp(lse_p, lse_n)  # [1, H, n]
    w_p = torch.exp(lse_p - lse).unsqueeze(-1)  # [1, H, n, 1]
    w_n = torch.exp(lse_n - lse).unsqueeze(-1)
    out = out_p.float() * w_p + out_n.float() * w_n  # [1, H, n, D]
    return out[0].to(q.dtype).transpose(0, 1)


def stored_kv(
    fb: ForwardBatch, layer_id: int, k: torch.Tensor, v: torch.Tensor, read_back: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Write this step's k, v [T, Hkv, D] into the pool; → (k, v as attention reads them
    back from the pool, the layer's K and V buffers [slots, Hkv, row] as stored). In a
    quantized pool (--kv-cache-dtype) the new tokens attend over their quantized K/V, as
    every later step and the C++ kernels see them (read_back=False: k, v as given, for a
    caller that reads only the pool)."""
    pool = fb.token_to_kv_pool
    pool.set_kv_buffer(layer_id, fb.out_cache_loc, k, v)
    k_buf, v_buf = pool.get_kv_buffer(layer_id)
    if pool.kv_format.quantized and read_back:
        k = gather_rows(k_buf, fb.out_cache_loc, k.dtype, k.shape[-1])
        v = gather_rows(v_buf, fb.out_cache_loc, v.dtype, v.shape[-1])
    return k, v, k_buf, v_buf


@dataclass
class TorchNativeMetadata:
    decode: _DecodeGroup | None
    extends: list[ExtendReq] = field(default_factory=list)
    masked: MaskedPlans | None = None  # for layers with a window or a softcap


@register_attention_backend("torch_native")
class TorchNativeAttnBackend(AttentionBackend):
    """Gather-and-SDPA attention over the slot table (see the module docstring)."""

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        fb = forward_batch
        device = fb.input_ids.device
        starts = fb.extend_start_loc
        pool_rows: list[int] = fb.req_pool_indices.tolist()
        decode_ids = [i for i, n in enumerate(fb.extend_lens) if n == 1]
        decode = None
        if decode_ids:
            all_decode = len(decode_ids) == fb.batch_size
            rows = (
                None if all_decode else torch.tensor([starts[i] for i in decode_ids], device=device)
            )
            seq_lens = [fb.prefix_lens[i] + 1 for i in decode_ids]
            decode = self._decode_group(fb, [pool_rows[i] for i in decode_ids], seq_lens, rows)
        extends = [
            extend_request(fb, i, pool_rows[i], starts[i])
            for i, n in enumerate(fb.extend_lens)
            if n > 1
        ]
        fb.attn_metadata = TorchNativeMetadata(decode, extends, MaskedPlans(fb))

    @staticmethod
    def _decode_group(
        fb: ForwardBatch, pool_rows: list[int], seq_lens: list[int], rows: torch.Tensor | None
    ) -> _DecodeGroup:
        device = fb.req_to_token.device
        max_len = max(seq_lens)
        row_index = torch.tensor(pool_rows, dtype=torch.int64, device=device)  # [Bd]
        kv_index = fb.req_to_token[row_index, :max_len]  # [Bd, max_len]
        if min(seq_lens) == max_len:
            return _DecodeGroup(rows, kv_index.reshape(-1), max_len, None)
        lens = torch.tensor(seq_lens, dtype=torch.int64, device=device)  # [Bd]
        valid = torch.arange(max_len, device=device)[None, :] < lens[:, None]  # [Bd, max_len]
        kv_index = kv_index.masked_fill(~valid, 0).reshape(-1)  # [Bd * max_len]
        return _DecodeGroup(rows, kv_index, max_len, valid[:, None, None, :])

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        forward_batch: ForwardBatch,
        options: AttnOptions = PLAIN_ATTENTION,
    ) -> torch.Tensor:
        md: TorchNativeMetadata = forward_batch.attn_metadata
        k, v, k_buf, v_buf = stored_kv(forward_batch, layer_id, k, v)
        num_tokens, num_heads, head_dim = q.shape
        scale = options.scale_for(head_dim)
        if options.needs_mask:
            plans = md.masked if md.masked is not None else MaskedPlans(forward_batch)
            plan = plans.get(options.sliding_window)
            out = masked_attention(q, k_buf, v_buf, plan, scale, options.logit_softcap)
            return out.reshape(num_tokens, -1)
        if md.decode is not None and md.decode.rows is None:  # a decode-only batch
            return self._decode(q, k_buf, v_buf, md.decode, scale).reshape(num_tokens, -1)
        if md.decode is None and len(md.extends) == 1:  # one extending request
            out = extend_attention(q, k, v, k_buf, v_buf, md.extends[0], scale)  # [T, H, D]
            return out.reshape(num_tokens, -1)
        out = q.new_empty(num_tokens, num_heads, head_dim)  # [T, H, D]
        if md.decode is not None:
            assert md.decode.rows is not None
            q_dec = q.index_select(0, md.decode.rows)  # [Bd, H, D]
            out.index_copy_(0, md.decode.rows,
                            self._decode(q_dec, k_buf, v_buf, md.decode, scale))
        for ext in md.extends:
            out[ext.start : ext.end] = extend_attention(q, k, v, k_buf, v_buf, ext, scale)
        return out.view(num_tokens, -1)

    @staticmethod
    def _decode(
        q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, group: _DecodeGroup,
        scale: float | None = None,
    ) -> torch.Tensor:
        """q [Bd, H, D] → [Bd, H, D]: one new token per request over its whole sequence."""
        shape = (q.shape[0], group.max_len, k_buf.shape[1], q.shape[2])
        keys = gather_rows(k_buf, group.kv_index, q.dtype, q.shape[-1]).view(shape)  # [Bd, L, Hkv, D]
        values = gather_rows(v_buf, group.kv_index, q.dtype, q.shape[-1]).view(shape)  # [Bd, L, Hkv, D]
        keys = keys.transpose(1, 2)  # [Bd, Hkv, L, D]
        values = values.transpose(1, 2)  # [Bd, Hkv, L, D]
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2), keys, values, attn_mask=group.mask, scale=scale, enable_gqa=True
        )  # [Bd, H, 1, D]
        return out.squeeze(2)
