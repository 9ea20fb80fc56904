"""The scheduler's view of memory: request rows, KV slots and the prefix cache.

Every KV slot is in exactly one of three places: free in the pool, owned by
the prefix cache, or owned by one running request (`Req.num_own_slots`).
`check_integrity()` asserts that identity (with the pools' and the cache's
own checks, a double free included); engine and server tests run it after
their requests. Admission, extension, truncation and release are the only
ways slots move.

The KVManager is the only writer of the req_to_token table (`_write_row`)
and of a request's memory fields (req_pool_idx, kv_len, cached_len,
last_node), so a future rank that mirrors the table needs those writes only.

With a disk tier (`--kv-cache-dir`), `match_for_admission` may read a
request's prefix back from disk first, and the KV handed to the cache is
written through to disk (kv_disk.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import torch

from radixlm.mem_cache.base_prefix_cache import BasePrefixCache, check_kv_accounting
from radixlm.mem_cache.disk_tier import KVDiskTier
from radixlm.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixlm.scheduler.kv_disk import DiskPrefetcher
from radixlm.scheduler.request import Req


class PrefixMatch(NamedTuple):
    """The cached prefix a request would get if admitted now."""

    kv_indices: torch.Tensor  # [L] int64 the cache's slots for the first L tokens
    last_node: Any  # the node to lock
    lock_cost: int  # slots that locking takes out of what eviction could free


class KVManager:
    def __init__(
        self,
        req_pool: ReqToTokenPool,
        kv_pool: TokenToKVPool,
        cache: BasePrefixCache,
        shares_prefixes: bool,
        disk_tier: KVDiskTier | None = None,
        write_through: bool = True,
    ) -> None:
        """disk_tier: the prefix cache's disk tier (None: none); write_through: offer every
        prefix handed to the cache to it, not only evicted ones."""
        self.req_pool = req_pool
        self.kv_pool = kv_pool
        self.cache = cache
        self.shares_prefixes = shares_prefixes
        self.disk: DiskPrefetcher[PrefixMatch] | None = (
            DiskPrefetcher(self, disk_tier, write_through)
            if disk_tier is not None and shares_prefixes else None)

    # ------------------------------------------------------------------ queries

    def num_available_slots(self) -> int:
        """Slots a step could get: free ones plus those eviction could free."""
        return self.kv_pool.available_size() + self.cache.evictable_size()

    def has_free_row(self) -> bool:
        return self.req_pool.available_size() > 0

    def match(self, req: Req) -> PrefixMatch:
        """The cached prefix `req` would get now (locks nothing)."""
        if not self.shares_prefixes:
            empty = torch.empty(0, dtype=torch.int64, device=self.kv_pool.device)
            return PrefixMatch(empty, None, 0)
        match = self.cache.match_prefix(req.token_ids[: req.max_prefix_len])
        return PrefixMatch(match.kv_indices, match.last_node, self.cache.lock_cost(match.last_node))

    def match_for_admission(self, req: Req) -> PrefixMatch | None:
        """`match(req)`, after reading more of its prefix back from the disk tier when
        it has some; None while req waits for such a read (it holds nothing meanwhile)."""
        match = self.match(req)
        return match if self.disk is None else self.disk.admission_match(req, match)

    def is_loading(self, req: Req) -> bool:
        """Whether req waits for its prefix to be read from the disk tier."""
        return self.disk is not None and self.disk.is_loading(req)

    def prefix_hit_len(self, req: Req) -> int:
        """Length of the cached prefix `req` would get now (for lpm ordering)."""
        return len(self.match(req).kv_indices) if self.shares_prefixes else 0

    # ------------------------------------------------------------------ actions

    def admit(self, req: Req, match: PrefixMatch) -> None:
        """Give `req` a request row and lock `match` (from `match(req)`, just before).

        Sets req_pool_idx, kv_len == cached_len == the prefix hit, last_node.
        """
        row = self.req_pool.alloc()
        assert row is not None, "admit() without has_free_row()"
        req.req_pool_idx = row
        n = len(match.kv_indices)
        if n:
            self._write_row(row, 0, match.kv_indices)
        self.cache.inc_lock_ref(match.last_node)
        req.last_node = match.last_node
        req.kv_len = req.cached_len = n
        if req.num_cached_tokens_disk is None:
            req.num_cached_tokens_disk = min(req.disk_hit_len, n)

    def alloc_slots(self, num_tokens: int) -> torch.Tensor | None:
        """`num_tokens` free KV slots, evicting from the cache if needed; None if impossible."""
        shortage = num_tokens - self.kv_pool.available_size()
        if shortage > 0:
            self.cache.evict(shortage)
        return self.kv_pool.alloc(num_tokens)

    def assign_slots(self, req: Req, start: int, slots: torch.Tensor) -> None:
        """Record `slots` as the KV of req's tokens [start, start + len(slots))."""
        assert req.req_pool_idx is not None
        self._write_row(req.req_pool_idx, start, slots)

    def advance(self, req: Req, kv_len: int) -> None:
        """The forward pass computed req's tokens up to `kv_len`."""
        req.kv_len = kv_len

    def truncate(self, req: Req, kv_len: int) -> None:
        """Drop the KV of req's tokens [kv_len, req.kv_len): their slots go back to the pool.

        Only the request's own slots can go (kv_len >= req.cached_len): the
        prefix cache may share the others.
        """
        assert req.cached_len <= kv_len <= req.kv_len, (req.cached_len, kv_len, req.kv_len)
        if kv_len < req.kv_len:
            self.kv_pool.free(self._row(req)[kv_len : req.kv_len].clone())
            req.kv_len = kv_len
            req.disk_offered_len = min(req.disk_offered_len, kv_len)

    def cache_unfinished(self, req: Req) -> None:
        """Share what `req` has computed so far with later requests."""
        if not self.shares_prefixes or req.kv_len == 0:
            return
        assert req.req_pool_idx is not None
        slots = self._row(req)[: req.kv_len].clone()
        if self.disk is not None:
            self.disk.offer(req, slots)
        match = self.cache.cache_unfinished(req.token_ids[: req.kv_len], slots, req.last_node)
        self._write_row(req.req_pool_idx, 0, match.kv_indices)
        req.last_node = match.last_node
        req.cached_len = len(match.kv_indices)

    def release(self, req: Req) -> None:
        """Return everything `req` holds: its KV to the cache or the pool, its row."""
        if req.req_pool_idx is None:
            return
        kv_indices = self._row(req)[: req.kv_len].clone()
        if self.disk is not None:
            self.disk.offer(req, kv_indices)
            req.disk_load, req.disk_keys = None, None
        if self.shares_prefixes:
            self.cache.cache_finished(req.token_ids[: req.kv_len], kv_indices, req.last_node)
        else:
            self.kv_pool.free(kv_indices)
        self.req_pool.free(req.req_pool_idx)
        req.req_pool_idx = None
        req.last_node = None

    def flush(self) -> None:
        """Empty the prefix cache and its disk tier (requires no request in flight)."""
        self.cache.reset()
        if self.disk is not None:
            self.disk.tier.flush()

    def close(self) -> None:
        """Finish the disk tier's queued writes (a few seconds at most) and stop it."""
        if self.disk is not None:
            self.disk.tier.close()

    def _row(self, req: Req) -> torch.Tensor:
        assert req.req_pool_idx is not None
        return self.req_pool.req_to_token[req.req_pool_idx]

    def _write_row(self, row: int, start: int, slots: torch.Tensor) -> None:
        """The one place that writes the req_to_token table."""
        self.req_pool.req_to_token[row, start : start + len(slots)] = slots

    # ------------------------------------------------------------------ checks

    def check_integrity(self, running: Iterable[Req]) -> None:
        """Assert free + cached + held by running requests == total slots, and that the
        pools and the cache are consistent (no slot or row freed twice)."""
        self.req_pool.check_integrity()
        held = sum(r.num_own_slots for r in running if r.req_pool_idx is not None)
        check_kv_accounting(self.kv_pool, self.cache, held)
        if self.disk is not None:
            self.disk.check_integrity()

    def stats(self) -> dict[str, int]:
        free = self.kv_pool.available_size()
        evictable = self.cache.evictable_size()
        return {
            "max_total_num_tokens": self.kv_pool.size,
            "num_free_tokens": free + evictable,
            "num_used_tokens": self.kv_pool.size - free - evictable,
            "num_cached_tokens": self.cache.total_size(),
            "num_free_req_slots": self.req_pool.available_size(),
            **(self.disk.stats() if self.disk is not None else {}),
        }
