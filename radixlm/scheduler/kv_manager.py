"""The scheduler's view of memory: request rows, KV slots and the prefix cache.

Every KV slot is in exactly one of three places: free in the pool, owned by
the prefix cache, or owned by one running request (`Req.num_own_slots`).
`check_integrity()` asserts that identity; tests call it after every engine
run. Admission, extension and release are the only ways slots move.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from radixlm.mem_cache.base_prefix_cache import BasePrefixCache
from radixlm.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixlm.scheduler.request import Req


class KVManager:
    def __init__(
        self,
        req_pool: ReqToTokenPool,
        kv_pool: TokenToKVPool,
        cache: BasePrefixCache,
        shares_prefixes: bool,
    ) -> None:
        self.req_pool = req_pool
        self.kv_pool = kv_pool
        self.cache = cache
        self.shares_prefixes = shares_prefixes

    # ------------------------------------------------------------------ queries

    def num_available_slots(self) -> int:
        """Slots a step could get: free ones plus those eviction could free."""
        return self.kv_pool.available_size() + self.cache.evictable_size()

    def prefix_hit_len(self, req: Req) -> int:
        """Length of the cached prefix `req` would get now (for lpm ordering)."""
        if not self.shares_prefixes:
            return 0
        key = req.fill_ids[: req.max_prefix_len]
        return len(self.cache.match_prefix(key).kv_indices)

    def can_admit(self) -> bool:
        return self.req_pool.available_size() > 0

    # ------------------------------------------------------------------ actions

    def admit(self, req: Req) -> None:
        """Give `req` a request row and lock its cached prefix.

        Sets req_pool_idx, kv_len == cached_len == prefix hit, last_node.
        """
        row = self.req_pool.alloc()
        assert row is not None, "admit() without can_admit()"
        req.req_pool_idx = row
        if not self.shares_prefixes:
            req.kv_len = req.cached_len = 0
            return
        match = self.cache.match_prefix(req.fill_ids[: req.max_prefix_len])
        n = len(match.kv_indices)
        self.cache.inc_lock_ref(match.last_node)
        req.last_node = match.last_node
        self.req_pool.req_to_token[row, :n] = match.kv_indices
        req.kv_len = req.cached_len = n

    def alloc_slots(self, num_tokens: int) -> torch.Tensor | None:
        """`num_tokens` free KV slots, evicting from the cache if needed; None if impossible."""
        shortage = num_tokens - self.kv_pool.available_size()
        if shortage > 0:
            self.cache.evict(shortage)
        return self.kv_pool.alloc(num_tokens)

    def assign_slots(self, req: Req, start: int, slots: torch.Tensor) -> None:
        """Record `slots` as the KV of req's tokens [start, start + len(slots))."""
        assert req.req_pool_idx is not None
        self.req_pool.req_to_token[req.req_pool_idx, start : start + len(slots)] = slots

    def truncate(self, req: Req, kv_len: int) -> None:
        """Drop the KV of req's tokens [kv_len, req.kv_len): their slots go back to the pool.

        Only the request's own slots can go (kv_len >= req.cached_len): the
        prefix cache may share the others.
        """
        assert req.cached_len <= kv_len <= req.kv_len, (req.cached_len, kv_len, req.kv_len)
        if kv_len < req.kv_len:
            assert req.req_pool_idx is not None
            row = self.req_pool.req_to_token[req.req_pool_idx]
            self.kv_pool.free(row[kv_len : req.kv_len].clone())
            req.kv_len = kv_len

    def cache_unfinished(self, req: Req) -> None:
        """Share what `req` has computed so far with later requests."""
        if not self.shares_prefixes or req.kv_len == 0:
            return
        assert req.req_pool_idx is not None
        row = self.req_pool.req_to_token[req.req_pool_idx]
        key = req.fill_ids[: req.kv_len]
        match = self.cache.cache_unfinished(key, row[: req.kv_len].clone(), req.last_node)
        row[: len(match.kv_indices)] = match.kv_indices
        req.last_node = match.last_node
        req.cached_len = len(match.kv_indices)

    def release(self, req: Req) -> None:
        """Return everything `req` holds: its KV to the cache or the pool, its row."""
        if req.req_pool_idx is None:
            return
        row = self.req_pool.req_to_token[req.req_pool_idx]
        kv_indices = row[: req.kv_len].clone()
        if self.shares_prefixes:
            self.cache.cache_finished(req.fill_ids[: req.kv_len], kv_indices, req.last_node)
        else:
            self.kv_pool.free(kv_indices)
        self.req_pool.free(req.req_pool_idx)
        req.req_pool_idx = None
        req.last_node = None

    # ------------------------------------------------------------------ checks

    def check_integrity(self, running: Iterable[Req]) -> None:
        """Assert free + cached + held by running requests == total slots."""
        self.cache.check_integrity()
        held = sum(r.num_own_slots for r in running if r.req_pool_idx is not None)
        free = self.kv_pool.available_size()
        cached = self.cache.total_size()
        total = self.kv_pool.size
        assert free + cached + held == total, (
            f"KV leak: free {free} + cached {cached} + held {held} != total {total}"
        )

    def stats(self) -> dict[str, int]:
        free = self.kv_pool.available_size()
        evictable = self.cache.evictable_size()
        return {
            "max_total_num_tokens": self.kv_pool.size,
            "num_free_tokens": free + evictable,
            "num_used_tokens": self.kv_pool.size - free - evictable,
            "num_cached_tokens": self.cache.total_size(),
            "num_free_req_slots": self.req_pool.available_size(),
        }
