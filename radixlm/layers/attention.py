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
- Extending requests (prefill chunks, jump-forward runs) go one by one: with
  no prefix, plain causal attention over the new k, v; with a prefix, the
  whole sequence is gathered and a causal mask shifted by the prefix applies.
- Index tensors and masks are built once per forward and shared by all layers.
- Grouped-query attention uses SDPA's `enable_gqa` (no repeated K/V copies).
- Sliding-window attention is not implemented: every layer attends over the
  whole sequence, which is exact for sequences no longer than the window.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from radixlm.model_executor.forward_batch import ForwardBatch


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
    ) -> torch.Tensor:
        """Attention of one layer. q [T, H, D], k and v [T, Hkv, D] → [T, H * D].

        Writes k, v into the pool at `forward_batch.out_cache_loc` (modifies the pool),
        then attends each request's tokens over its prefix and, causally, its new tokens.
        """


_BACKENDS: dict[str, type[AttentionBackend]] = {}


def register_attention_backend(
    name: str,
) -> Callable[[type[AttentionBackend]], type[AttentionBackend]]:
    """Class decorator: make a backend available to `create_attention_backend(name)`."""

    def wrap(cls: type[AttentionBackend]) -> type[AttentionBackend]:
        _BACKENDS[name] = cls
        return cls

    return wrap


def create_attention_backend(name: str, model: nn.Module | None = None) -> AttentionBackend:
    """A new backend by registered name (e.g. "torch_native")."""
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; available: {sorted(_BACKENDS)}")
    return _BACKENDS[name](model)


@dataclass
class _DecodeGroup:
    rows: torch.Tensor | None  # [Bd] token rows of the batch; None: all rows, in order
    kv_index: torch.Tensor  # [Bd * max_len] KV slots, request-major, padding → slot 0
    max_len: int
    mask: torch.Tensor | None  # [Bd, 1, 1, max_len] bool (True = attend); None: no padding


@dataclass
class _ExtendReq:
    start: int  # token rows [start, end) of the batch
    end: int
    kv_index: torch.Tensor | None  # [prefix + extend] KV slots; None: no prefix
    mask: torch.Tensor | None  # [extend, prefix + extend] bool; None: plain causal


@dataclass
class TorchNativeMetadata:
    decode: _DecodeGroup | None
    extends: list[_ExtendReq] = field(default_factory=list)


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
        extends = []
        for i, n in enumerate(fb.extend_lens):
            if n <= 1:
                continue
            prefix_len = fb.prefix_lens[i]
            kv_index = mask = None
            if prefix_len > 0:
                kv_index = fb.req_to_token[pool_rows[i], : prefix_len + n]  # [prefix + n]
                key_pos = torch.arange(prefix_len + n, device=device)
                query_pos = torch.arange(prefix_len, prefix_len + n, device=device)
                mask = key_pos[None, :] <= query_pos[:, None]  # [n, prefix + n]
            extends.append(_ExtendReq(starts[i], starts[i] + n, kv_index, mask))
        fb.attn_metadata = TorchNativeMetadata(decode, extends)

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
    ) -> torch.Tensor:
        md: TorchNativeMetadata = forward_batch.attn_metadata
        pool = forward_batch.token_to_kv_pool
        pool.set_kv_buffer(layer_id, forward_batch.out_cache_loc, k, v)
        k_buf, v_buf = pool.get_kv_buffer(layer_id)  # each [slots, Hkv, D]
        num_tokens, num_heads, head_dim = q.shape
        if md.decode is not None and md.decode.rows is None:  # a decode-only batch
            return self._decode(q, k_buf, v_buf, md.decode).reshape(num_tokens, -1)
        if md.decode is None and len(md.extends) == 1:  # one extending request
            out = self._extend(q, k, v, k_buf, v_buf, md.extends[0])  # [T, H, D]
            return out.reshape(num_tokens, -1)
        out = q.new_empty(num_tokens, num_heads, head_dim)  # [T, H, D]
        if md.decode is not None:
            assert md.decode.rows is not None
            q_dec = q.index_select(0, md.decode.rows)  # [Bd, H, D]
            out.index_copy_(0, md.decode.rows, self._decode(q_dec, k_buf, v_buf, md.decode))
        for ext in md.extends:
            out[ext.start : ext.end] = self._extend(q, k, v, k_buf, v_buf, ext)
        return out.view(num_tokens, -1)

    @staticmethod
    def _decode(
        q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, group: _DecodeGroup
    ) -> torch.Tensor:
        """q [Bd, H, D] → [Bd, H, D]: one new token per request over its whole sequence."""
        shape = (q.shape[0], group.max_len, k_buf.shape[1], k_buf.shape[2])
        # NOTE: index_select, not k_buf[index]: an order of magnitude faster on the CPU.
        keys = k_buf.index_select(0, group.kv_index).view(shape)  # [Bd, L, Hkv, D]
        values = v_buf.index_select(0, group.kv_index).view(shape)  # [Bd, L, Hkv, D]
        keys = keys.to(q.dtype).transpose(1, 2)  # [Bd, Hkv, L, D]
        values = values.to(q.dtype).transpose(1, 2)  # [Bd, Hkv, L, D]
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2), keys, values, attn_mask=group.mask, enable_gqa=True
        )  # [Bd, H, 1, D]
        return out.squeeze(2)

    @staticmethod
    def _extend(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        ext: _ExtendReq,
    ) -> torch.Tensor:
        """One request's new tokens over its prefix and themselves → [n, H, D]."""
        q_req = q[ext.start : ext.end].transpose(0, 1)  # [H, n, D]
        if ext.kv_index is None:
            keys = k[ext.start : ext.end].transpose(0, 1)  # [Hkv, n, D]
            values = v[ext.start : ext.end].transpose(0, 1)  # [Hkv, n, D]
            out = F.scaled_dot_product_attention(
                q_req, keys, values, is_causal=True, enable_gqa=True
            )  # [H, n, D]
        else:
            keys = k_buf.index_select(0, ext.kv_index).to(q.dtype).transpose(0, 1)
            values = v_buf.index_select(0, ext.kv_index).to(q.dtype).transpose(0, 1)
            # keys, values: [Hkv, prefix + n, D]
            out = F.scaled_dot_product_attention(
                q_req, keys, values, attn_mask=ext.mask, enable_gqa=True
            )  # [H, n, D]
        return out.transpose(0, 1)
