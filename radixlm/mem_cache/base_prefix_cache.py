"""The prefix-cache contract that `RadixCache` and `ChunkCache` share.

Ownership of KV slots. Every usable slot of the `TokenToKVPool` is, at any
moment, in exactly one of three places:

- free in the pool;
- owned by the cache (`total_size()` counts them), whether locked or not;
- held by a running request: slots it allocated itself and has not handed
  to the cache.

A request that matched a prefix uses the cache's slots for those positions
and holds a lock on `last_node`; while locked, those slots are neither
evicted nor the request's to free. The request's own slots begin right after
the locked prefix: positions `[len(match.kv_indices), seq_len)` of its row.
`cache_unfinished` / `cache_finished` hand those slots to the cache, which
keeps the new ones and frees the ones that duplicate what it already holds.

`check_kv_accounting` states the resulting identity:
`free + cache.total_size() + held == kv_pool.size`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, NamedTuple

import torch

from radixlm.mem_cache.memory_pool import TokenToKVPool


class MatchResult(NamedTuple):
    kv_indices: torch.Tensor  # [L] int64 KV slots of the longest cached prefix of the key
    last_node: Any  # node to lock while the request uses that prefix


class BasePrefixCache(ABC):
    """Prefix cache over the TokenToKVPool; both implementations share this contract.

    Keys are token-id lists (images enter as pseudo-token ids). A `last_node`
    argument of None means "nothing locked" and is accepted everywhere a node is.
    """

    def __init__(self, kv_pool: TokenToKVPool) -> None:
        self.kv_pool = kv_pool

    @abstractmethod
    def match_prefix(self, key: list[int]) -> MatchResult:
        """The cached slots of the longest cached prefix of `key` and its node.

        Updates the LRU time of the matched path. Locks nothing: call
        `inc_lock_ref(result.last_node)` before relying on the slots.
        """

    @abstractmethod
    def insert(self, key: list[int], kv_indices: torch.Tensor) -> int:
        """Insert key → kv_indices ([len(key)] int64); return how many leading tokens were cached.

        The cache takes ownership of `kv_indices[returned:]`. The slots in
        `kv_indices[:returned]` stay the caller's: it frees those it owns
        (the cache_* methods below do that bookkeeping).
        """

    @abstractmethod
    def cache_unfinished(
        self, key: list[int], kv_indices: torch.Tensor, last_node: Any
    ) -> MatchResult:
        """Hand a running request's KV to the cache and move its lock to the new end.

        `key` is the request's tokens with KV so far, `kv_indices` ([len(key)])
        its row of slots, `last_node` its current lock. Inserts the key, frees
        the request's own slots that duplicate cached ones, locks the new last
        node, unlocks `last_node`, and returns the cache's slots for the whole
        key (the caller writes them back into its req_to_token row) and the
        node now locked. Afterwards the request holds no slots of its own.
        """

    @abstractmethod
    def cache_finished(self, key: list[int], kv_indices: torch.Tensor, last_node: Any) -> None:
        """Hand a finished, aborted or retracted request's KV to the cache and unlock it.

        Same arguments as `cache_unfinished`. Afterwards the request holds no
        slots and no lock; its row may be freed.
        """

    @abstractmethod
    def inc_lock_ref(self, node: Any) -> None:
        """Protect `node` and its path to the root from eviction (reference counted)."""

    @abstractmethod
    def dec_lock_ref(self, node: Any) -> None:
        """Undo one `inc_lock_ref(node)`. Raises on a lock count going below zero."""

    @abstractmethod
    def lock_cost(self, node: Any) -> int:
        """Tokens that `inc_lock_ref(node)` would move out of `evictable_size()` now.

        Lets a caller check that a request fits before it locks the request's prefix.
        """

    @abstractmethod
    def evict(self, num_tokens: int) -> int:
        """Free at least num_tokens slots from unlocked leaves, LRU first, if there are that many.

        Returns the number freed (less than num_tokens only when nothing is left to evict).
        """

    @abstractmethod
    def evictable_size(self) -> int:
        """Tokens in unlocked nodes."""

    @abstractmethod
    def protected_size(self) -> int:
        """Tokens in locked nodes."""

    def total_size(self) -> int:
        """Slots the cache owns: evictable + protected."""
        return self.evictable_size() + self.protected_size()

    @abstractmethod
    def reset(self) -> None:
        """Drop everything (flush_cache), freeing all slots the cache owns. Requires no locks."""

    @abstractmethod
    def check_integrity(self) -> None:
        """Raise AssertionError on any broken invariant of the cache."""


def check_kv_accounting(
    kv_pool: TokenToKVPool, cache: BasePrefixCache, num_slots_held_by_running_reqs: int
) -> None:
    """Assert that every KV slot is free, owned by the cache, or held by a request, exactly once.

    `num_slots_held_by_running_reqs` is the number of slots that requests
    allocated themselves and have not handed to the cache: summed over every
    request that has a req_to_token row, `kv_len - len(prefix)`, where
    `kv_len` counts the positions of its row with a slot and `prefix` is the
    `kv_indices` of its latest `MatchResult` (from match_prefix or
    cache_unfinished; empty with ChunkCache or when nothing matched).
    Also runs the pool's and the cache's own integrity checks.
    """
    kv_pool.check_integrity()
    cache.check_integrity()
    num_free = kv_pool.available_size()
    num_cached = cache.total_size()
    total = num_free + num_cached + num_slots_held_by_running_reqs
    assert total == kv_pool.size, (
        f"KV slot leak: free {num_free} + cached {num_cached} + held "
        f"{num_slots_held_by_running_reqs} = {total} != pool size {kv_pool.size}"
    )
