"""Attention for layers that ask more than causal softmax: a sliding window, a logit softcap.

A layer's `AttnOptions` (attention.py) may name a sliding window W (a query at
position p sees the keys at positions p - W < j <= p, as transformers'
`sliding_window_overlay` defines it) and a softcap c (scores become
c * tanh(scores / c) before the mask, as Gemma's attention does). The
torch-native backend sends such layers here; the C++ paged kernel computes
windows itself and sends only softcapped layers (and, under a window, steps with
extends too long for its head dim) here (cpu_attention.py).

The keys are read from the pool, this step's included (a backend writes them
before it attends), only where a window can still see them: a decode reads
its last W tokens, not the whole sequence. Per forward and per window size,
one `MaskedPlan` (what each request sees, and the mask over it) is built on
first use and shared by every layer with that window.

NOTE: the pool keeps every token's K/V for every layer, sliding layers too, so
the radix cache stays exact under windows: a prefix shared by another request
has whatever its window needs. What a window can no longer see (tokens older
than W of every request using them, in sliding layers only) could be freed by
a pool with per-layer-kind slots (SGLang's SWA pool); this one keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from radixlm.mem_cache.kv_format import gather_rows

if TYPE_CHECKING:
    from radixlm.model_executor.forward_batch import ForwardBatch


@dataclass
class _DecodeRows:
    rows: torch.Tensor  # [Bd] token rows of the batch (one new token per request)
    kv_index: torch.Tensor  # [Bd * L] visible KV slots, request-major; padding → slot 0
    max_len: int  # L
    mask: torch.Tensor | None  # [Bd, 1, 1, L] bool (True = attend); None: no padding


@dataclass
class _ExtendRows:
    start: int  # token rows [start, end) of the batch
    end: int
    kv_index: torch.Tensor  # [L] KV slots of the visible keys, oldest first
    mask: torch.Tensor  # [n, L] bool (True = attend)


@dataclass
class MaskedPlan:
    """What each request's new tokens see under one window (None: the whole sequence)."""

    decode: _DecodeRows | None
    extends: list[_ExtendRows] = field(default_factory=list)


def _visible_start(prefix_len: int, window: int | None) -> int:
    """The first key position the request's first new token (at prefix_len) can see."""
    return 0 if window is None else max(0, prefix_len - window + 1)


def build_plan(fb: ForwardBatch, window: int | None) -> MaskedPlan:
    """The plan of this forward for layers with `window`."""
    device = fb.req_to_token.device
    pool_rows: list[int] = fb.req_pool_indices.tolist()
    starts = fb.extend_start_loc
    decode_ids = [i for i, n in enumerate(fb.extend_lens) if n == 1]
    decode = _decode_rows(fb, decode_ids, pool_rows, starts, window) if decode_ids else None
    extends = []
    for i, n in enumerate(fb.extend_lens):
        if n <= 1:
            continue
        prefix_len = fb.prefix_lens[i]
        lo, seq_len = _visible_start(prefix_len, window), prefix_len + n
        key_pos = torch.arange(lo, seq_len, device=device)  # [L]
        query_pos = torch.arange(prefix_len, seq_len, device=device)  # [n]
        mask = key_pos[None, :] <= query_pos[:, None]  # [n, L]
        if window is not None:
            mask &= key_pos[None, :] > query_pos[:, None] - window
        kv_index = fb.req_to_token[pool_rows[i], lo:seq_len]  # [L]
        extends.append(_ExtendRows(starts[i], starts[i] + n, kv_index, mask))
    return MaskedPlan(decode, extends)


def _decode_rows(fb: ForwardBatch, ids: list[int], pool_rows: list[int], starts: list[int],
                 window: int | None) -> _DecodeRows:
    device = fb.req_to_token.device
    seq_lens = [fb.prefix_lens[i] + 1 for i in ids]
    los = [_visible_start(fb.prefix_lens[i], window) for i in ids]
    lens = [s - lo for s, lo in zip(seq_lens, los)]
    max_len = max(lens)
    row_index = torch.tensor([pool_rows[i] for i in ids], dtype=torch.int64, device=device)
    offsets = torch.arange(max_len, device=device)  # [L]
    pos = torch.tensor(los, device=device)[:, None] + offsets[None, :]  # [Bd, L]
    valid = offsets[None, :] < torch.tensor(lens, device=device)[:, None]  # [Bd, L]
    pos = pos.masked_fill(~valid, 0)
    kv_index = fb.req_to_token[row_index[:, None], pos].masked_fill(~valid, 0)  # [Bd, L]
    rows = torch.tensor([starts[i] for i in ids], dtype=torch.int64, device=fb.input_ids.device)
    mask = None if min(lens) == max_len else valid[:, None, None, :]
    return _DecodeRows(rows, kv_index.reshape(-1), max_len, mask)


class MaskedPlans:
    """A forward's plans by window, built on first use (layers share them)."""

    def __init__(self, forward_batch: ForwardBatch) -> None:
        self._fb = forward_batch
        self._plans: dict[int | None, MaskedPlan] = {}

    def get(self, window: int | None) -> MaskedPlan:
        plan = self._plans.get(window)
        if plan is None:
            plan = self._plans[window] = build_plan(self._fb, window)
        return plan


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
           scale: float, softcap: float | None) -> torch.Tensor:
    """q [B, H, n, D], k and v [B, Hkv, L, D], mask broadcastable to [B, H, n, L] (bool,
    True = attend) → [B, H, n, D]. With softcap, scores are capped before the mask."""
    if softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                              enable_gqa=True)
    batch, num_heads, n, head_dim = q.shape
    num_kv_heads = k.shape[1]
    qg = q.reshape(batch, num_kv_heads, num_heads // num_kv_heads, n, head_dim)
    scores = torch.einsum("bkgnd,bkld->bkgnl", qg, k).float() * scale  # [B, Hkv, G, n, L]
    scores = softcap * torch.tanh(scores / softcap)
    if mask is not None:
        mask = mask.reshape(batch, 1, 1, *mask.shape[-2:]) if mask.dim() == 4 else mask
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype)  # [B, Hkv, G, n, L]
    out = torch.einsum("bkgnl,bkld->bkgnd", probs, v)  # [B, Hkv, G, n, D]
    return out.reshape(batch, num_heads, n, head_dim)


def masked_attention(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                     plan: MaskedPlan, scale: float, softcap: float | None) -> torch.Tensor:
    """Every row of the batch under `plan`: q [T, H, D] → [T, H, D].

    k_buf, v_buf [slots, Hkv, row]: the pool as stored (kv_format.py), with this step's
    keys already written."""
    out = q.new_empty(q.shape)  # [T, H, D]
    head_dim = q.shape[-1]
    if plan.decode is not None:
        dec = plan.decode
        q_dec = q.index_select(0, dec.rows)  # [Bd, H, D]
        shape = (q_dec.shape[0], dec.max_len, k_buf.shape[1], head_dim)
        keys = gather_rows(k_buf, dec.kv_index, q.dtype, head_dim).view(shape).transpose(1, 2)
        values = gather_rows(v_buf, dec.kv_index, q.dtype, head_dim).view(shape).transpose(1, 2)
        # keys, values: [Bd, Hkv, L, D]
        res = attend(q_dec.unsqueeze(2), keys, values, dec.mask, scale, softcap)  # [Bd, H, 1, D]
        out.index_copy_(0, dec.rows, res.squeeze(2))
    for ext in plan.extends:
        q_req = q[ext.start : ext.end].transpose(0, 1)[None]  # [1, H, n, D]
        keys = gather_rows(k_buf, ext.kv_index, q.dtype, head_dim).transpose(0, 1)[None]
        values = gather_rows(v_buf, ext.kv_index, q.dtype, head_dim).transpose(0, 1)[None]
        # keys, values: [1, Hkv, L, D]
        res = attend(q_req, keys, values, ext.mask[None, None], scale, softcap)  # [1, H, n, D]
        out[ext.start : ext.end] = res[0].transpose(0, 1)
    return out
