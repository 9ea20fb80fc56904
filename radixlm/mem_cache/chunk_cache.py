"""ChunkCache: the prefix cache of `--disable-radix-cache`, with the same interface and no sharing.

It owns no slots: nothing matches, a running request keeps every slot it
allocated, and a finished request's slots go straight back to the pool. All
sizes are 0, so the accounting identity reads free + held == pool size.
"""

from __future__ import annotations

from typing import Any

import torch

from radixlm.mem_cache.base_prefix_cache import BasePrefixCache, MatchResult


class ChunkCache(BasePrefixCache):
    """A prefix cache that caches nothing; `last_node` is always None."""

    def match_prefix(self, key: list[int]) -> MatchResult:
        return MatchResult(torch.empty(0, dtype=torch.int64, device=self.kv_pool.device), None)

    def insert(self, key: list[int], kv_indices: torch.Tensor) -> int:
        """Takes ownership of all of kv_indices, as the contract says, and frees them at once."""
        if len(key) != kv_indices.numel():
            raise ValueError(f"key has {len(key)} tokens but {kv_indices.numel()} KV slots")
        self.kv_pool.free(kv_indices)
        return 0

    def cache_unfinished(
        self, key: list[int], kv_indices: torch.Tensor, last_node: Any
    ) -> MatchResult:
        """The request keeps its slots: returns kv_indices unchanged (and node None)."""
        return MatchResult(kv_indices, None)

    def cache_finished(self, key: list[int], kv_indices: torch.Tensor, last_node: Any) -> None:
        """Frees all of kv_indices."""
        self.kv_pool.free(kv_indices)

    def inc_lock_ref(self, node: Any) -> None:
        pass

    def dec_lock_ref(self, node: Any) -> None:
        pass

    def lock_cost(self, node: Any) -> int:
        return 0

    def evict(self, num_tokens: int) -> int:
        return 0

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def reset(self) -> None:
        pass

    def check_integrity(self) -> None:
        pass
