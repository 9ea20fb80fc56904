from __future__ import annotations

import torch

from radixlm.mem_cache import ChunkCache, TokenToKVPool, check_kv_accounting


def make(size: int = 16) -> tuple[TokenToKVPool, ChunkCache]:
    pool = TokenToKVPool(
        size, num_layers=1, num_kv_heads=1, head_dim=1, dtype=torch.float32, debug=True
    )
    return pool, ChunkCache(pool)


def test_chunk_cache_shares_nothing() -> None:
    pool, cache = make()
    match = cache.match_prefix([1, 2, 3])
    assert match.kv_indices.numel() == 0 and match.kv_indices.dtype == torch.int64
    cache.inc_lock_ref(match.last_node)
    kv = pool.alloc(3)
    assert kv is not None
    again = cache.cache_unfinished([1, 2, 3], kv, match.last_node)
    assert again.kv_indices is kv  # the request keeps its own slots
    check_kv_accounting(pool, cache, 3)
    assert cache.match_prefix([1, 2, 3]).kv_indices.numel() == 0
    cache.cache_finished([1, 2, 3], kv, again.last_node)
    assert pool.available_size() == 16
    assert cache.evictable_size() == cache.protected_size() == cache.total_size() == 0
    assert cache.evict(10) == 0
    check_kv_accounting(pool, cache, 0)


def test_chunk_cache_insert_takes_and_frees_the_slots() -> None:
    pool, cache = make()
    kv = pool.alloc(4)
    assert kv is not None
    assert cache.insert([1, 2, 3, 4], kv) == 0
    check_kv_accounting(pool, cache, 0)
    cache.reset()
    check_kv_accounting(pool, cache, 0)
