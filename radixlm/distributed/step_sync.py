"""Rank 0 tells the other ranks what to compute: one broadcast per forward pass.

Each message is a `TPMessage` pickled through `broadcast_object_list`:

- a step: the scheduler's `ForwardStep` without what only rank 0 reads (how rows
  sample, grammar masks: rank 0 samples), plus the `req_to_token` rows that changed.
  The scheduler's KVManager writes that table on rank 0 only (a radix-cache hit
  fills a row's prefix, a retraction empties it); the other ranks keep a copy.
  Rank 0 keeps `_synced`, the table as the other ranks hold it, and sends, per
  item, the first changed position of its row up to its prefix, and the
  slots from there on. This step's own slots arrive as `out_cache_loc`, which
  every rank writes into its copy the same way. A decoding request sends no row.
- a heartbeat: an idle rank 0 sends one every `timeout / 4` seconds, so the other
  ranks' wait for the next step never reaches the collective timeout, which
  stays what finds a dead or hung rank 0.
- stop: rank 0 is shutting down; the other ranks exit 0.
"""

from __future__ import annotations

import dataclasses
import time
from typing import NamedTuple

import torch

from radixlm.mem_cache.memory_pool import lazy_zeros
from radixlm.messages.forward_step import ForwardStep


class RowUpdate(NamedTuple):
    """req_to_token[row, start : start + len(slots)] = slots."""

    row: int
    start: int
    slots: torch.Tensor  # [n] int64


class TPMessage(NamedTuple):
    kind: str  # "step" | "heartbeat" | "stop"
    step: ForwardStep | None = None
    rows: list[RowUpdate] | None = None


def shard_step(step: ForwardStep) -> ForwardStep:
    """What the other ranks need of a step: everything but sampling and grammar masks."""
    items = [dataclasses.replace(it, sampling=None, mm_inputs=None) for it in step.items]
    return ForwardStep(items, step.out_cache_loc, None, [])


def write_step_slots(req_to_token: torch.Tensor, step: ForwardStep) -> None:
    """Write each item's new slots (out_cache_loc) at its positions, as the KVManager did."""
    offset = 0
    for item in step.items:
        n = item.extend_len
        req_to_token[item.req_pool_idx, item.prefix_len : item.prefix_len + n] = (
            step.out_cache_loc[offset : offset + n].to(req_to_token.device))
        offset += n


class StepBroadcaster:
    """Rank 0's side: send each step (with its changed rows), heartbeats, and stop."""

    def __init__(self, req_to_token: torch.Tensor, timeout: float) -> None:
        self._table = req_to_token  # [rows, max_len]: the scheduler's, written by KVManager
        # what the others hold (lazily zeroed, as the table: resident only where written)
        self._synced = lazy_zeros(tuple(req_to_token.shape), req_to_token.dtype)
        self._heartbeat_every = max(timeout / 4, 0.5)
        self._last_send = time.monotonic()

    def send_step(self, step: ForwardStep) -> None:
        rows: list[RowUpdate] = []
        for item in step.items:
            if item.prefix_len == 0:
                continue
            real = self._table[item.req_pool_idx, : item.prefix_len].cpu()  # [prefix]
            known = self._synced[item.req_pool_idx, : item.prefix_len]  # [prefix]
            changed = (real != known).nonzero()
            if changed.numel():
                start = int(changed[0])
                rows.append(RowUpdate(item.req_pool_idx, start, real[start:].clone()))
                known[start:] = real[start:]
        write_step_slots(self._synced, step)
        self._send(TPMessage("step", shard_step(step), rows))

    def keep_alive(self) -> None:
        """Send a heartbeat when nothing was sent for a while (call it from the idle loop)."""
        if time.monotonic() - self._last_send >= self._heartbeat_every:
            self._send(TPMessage("heartbeat"))

    def stop(self) -> None:
        self._send(TPMessage("stop"))

    def _send(self, msg: TPMessage) -> None:
        import torch.distributed as dist

        dist.broadcast_object_list([msg], src=0)
        self._last_send = time.monotonic()


def receive_message() -> TPMessage:
    """A worker rank's side: wait (at most the group's timeout) for rank 0's next message."""
    import torch.distributed as dist

    box: list[object] = [None]
    dist.broadcast_object_list(box, src=0)
    msg = box[0]
    assert isinstance(msg, TPMessage), f"unexpected TP message {type(msg)}"
    return msg


def apply_rows(req_to_token: torch.Tensor, rows: list[RowUpdate]) -> None:
    for row, start, slots in rows:
        req_to_token[row, start : start + len(slots)] = slots.to(req_to_token.device)
