from __future__ import annotations

import pytest
import torch

from radixlm.mem_cache import (
    BasePrefixCache,
    ChunkCache,
    RadixCache,
    TokenToKVPool,
    TreeNode,
    check_kv_accounting,
    create_prefix_cache,
)


def make(size: int = 32) -> tuple[TokenToKVPool, RadixCache]:
    pool = TokenToKVPool(
        size, num_layers=1, num_kv_heads=1, head_dim=1, dtype=torch.float32, debug=True
    )
    return pool, RadixCache(pool)


def alloc(pool: TokenToKVPool, n: int) -> torch.Tensor:
    slots = pool.alloc(n)
    assert slots is not None
    return slots


def put(pool: TokenToKVPool, cache: RadixCache, key: list[int]) -> torch.Tensor:
    """Cache `key` as a request with no match would: allocate, then cache_finished."""
    slots = alloc(pool, len(key))
    cache.cache_finished(key, slots, None)
    return slots


def test_empty_cache_matches_nothing() -> None:
    pool, cache = make()
    match = cache.match_prefix([1, 2, 3])
    assert match.kv_indices.numel() == 0 and match.kv_indices.dtype == torch.int64
    assert match.last_node is cache.root
    assert cache.match_prefix([]).kv_indices.numel() == 0
    check_kv_accounting(pool, cache, 0)


def test_insert_returns_cached_prefix_len() -> None:
    pool, cache = make()
    a = alloc(pool, 4)
    assert cache.insert([1, 2, 3, 4], a) == 0
    b = alloc(pool, 3)
    assert cache.insert([1, 2, 9], b) == 2  # the caller still owns b[:2]
    pool.free(b[:2])
    c = alloc(pool, 2)
    assert cache.insert([1, 2], c) == 2
    pool.free(c)
    assert cache.total_size() == 5 and cache.evictable_size() == 5
    match = cache.match_prefix([1, 2, 9, 7])
    assert match.kv_indices.tolist() == [*a[:2].tolist(), b[2].item()]
    check_kv_accounting(pool, cache, 0)


def test_insert_rejects_length_mismatch() -> None:
    pool, cache = make()
    with pytest.raises(ValueError):
        cache.insert([1, 2], alloc(pool, 3))


def test_match_splits_node_at_partial_match() -> None:
    pool, cache = make()
    slots = put(pool, cache, [1, 2, 3, 4])
    (node,) = cache.root.children.values()
    match = cache.match_prefix([1, 2, 7])
    assert match.kv_indices.tolist() == slots[:2].tolist()
    assert isinstance(match.last_node, TreeNode) and match.last_node.key == [1, 2]
    (upper,) = cache.root.children.values()
    assert upper is match.last_node and upper.children == {3: node}
    assert node.key == [3, 4]  # the original object is the lower half
    assert cache.total_size() == 4
    cache.check_integrity()


def test_split_keeps_locks_of_the_original_node() -> None:
    pool, cache = make()
    put(pool, cache, [1, 2, 3, 4])
    match = cache.match_prefix([1, 2, 3, 4])
    cache.inc_lock_ref(match.last_node)
    cache.match_prefix([1, 2, 5])  # splits the locked node
    assert cache.protected_size() == 4 and cache.evictable_size() == 0
    cache.check_integrity()
    cache.dec_lock_ref(match.last_node)  # the lock still means the 4-token prefix
    assert cache.protected_size() == 0 and cache.evictable_size() == 4
    check_kv_accounting(pool, cache, 0)


def test_locks_propagate_to_root_and_underflow_raises() -> None:
    pool, cache = make()
    put(pool, cache, [1, 2, 3])
    put(pool, cache, [1, 2, 4, 5])
    leaf = cache.match_prefix([1, 2, 4, 5]).last_node
    cache.inc_lock_ref(leaf)
    assert cache.protected_size() == 4 and cache.evictable_size() == 1
    cache.inc_lock_ref(leaf)
    cache.dec_lock_ref(leaf)
    assert cache.protected_size() == 4
    cache.dec_lock_ref(leaf)
    assert cache.protected_size() == 0
    with pytest.raises(ValueError):
        cache.dec_lock_ref(leaf)


def test_evict_never_touches_locked_nodes() -> None:
    pool, cache = make()
    put(pool, cache, [1, 2, 3])
    put(pool, cache, [1, 2, 4])
    put(pool, cache, [5, 6])
    match = cache.match_prefix([1, 2, 3])
    cache.inc_lock_ref(match.last_node)
    assert cache.evict(100) == 3  # [4] and [5, 6]; [1, 2] and [3] are locked
    assert cache.match_prefix([1, 2, 3]).kv_indices.tolist() == match.kv_indices.tolist()
    assert cache.match_prefix([1, 2, 4]).kv_indices.numel() == 2
    assert cache.match_prefix([5, 6]).kv_indices.numel() == 0
    assert cache.evictable_size() == 0 and cache.protected_size() == 3
    check_kv_accounting(pool, cache, 0)
    cache.dec_lock_ref(match.last_node)
    assert cache.evict(1) == 1  # the leaf [3] goes first; its parent then becomes a leaf
    assert cache.evict(2) == 2
    assert cache.total_size() == 0 and pool.available_size() == pool.size
    check_kv_accounting(pool, cache, 0)


def test_evict_is_lru() -> None:
    pool, cache = make()
    put(pool, cache, [1, 1])
    put(pool, cache, [2, 2])
    put(pool, cache, [3, 3])
    cache.match_prefix([1, 1])  # touch the oldest
    assert cache.evict(1) == 2
    assert cache.match_prefix([2, 2]).kv_indices.numel() == 0
    assert cache.evict(1) == 2
    assert cache.match_prefix([3, 3]).kv_indices.numel() == 0
    assert cache.match_prefix([1, 1]).kv_indices.numel() == 2
    check_kv_accounting(pool, cache, 0)


def test_evict_frees_at_least_what_is_asked() -> None:
    pool, cache = make()
    put(pool, cache, [1, 2, 3, 4])
    put(pool, cache, [5])
    assert cache.evict(2) == 4  # the oldest leaf has 4 tokens: all of them go
    assert cache.evict(0) == 0
    assert cache.evict(3) == 1  # less than asked: nothing else is left
    assert cache.evict(1) == 0
    check_kv_accounting(pool, cache, 0)


def test_cache_finished_frees_duplicates() -> None:
    pool, cache = make(16)
    # Two requests with the same prompt computed it independently (neither matched).
    a, b = alloc(pool, 4), alloc(pool, 4)
    cache.cache_finished([7, 8, 9, 10], a, None)
    check_kv_accounting(pool, cache, num_slots_held_by_running_reqs=4)
    cache.cache_finished([7, 8, 9, 10], b, None)
    assert pool.available_size() == 12  # b was freed, the tree keeps a
    assert cache.match_prefix([7, 8, 9, 10]).kv_indices.tolist() == a.tolist()
    check_kv_accounting(pool, cache, 0)


def test_cache_finished_keeps_the_matched_prefix() -> None:
    pool, cache = make(16)
    first = put(pool, cache, [1, 2, 3])
    match = cache.match_prefix([1, 2, 3, 4, 5])
    cache.inc_lock_ref(match.last_node)
    own = alloc(pool, 2)
    kv = torch.cat([match.kv_indices, own])
    check_kv_accounting(pool, cache, 2)
    cache.cache_finished([1, 2, 3, 4, 5], kv, match.last_node)
    assert cache.protected_size() == 0 and cache.total_size() == 5
    assert cache.match_prefix([1, 2, 3, 4, 5]).kv_indices.tolist() == [
        *first.tolist(),
        *own.tolist(),
    ]
    check_kv_accounting(pool, cache, 0)


def test_cache_unfinished_over_chunks() -> None:
    pool, cache = make(16)
    key = [4, 5, 6, 7, 8, 9]
    kv = alloc(pool, 3)  # first chunk
    match = cache.cache_unfinished(key[:3], kv, None)
    assert match.kv_indices.tolist() == kv.tolist() and cache.protected_size() == 3
    check_kv_accounting(pool, cache, 0)
    kv = torch.cat([match.kv_indices, alloc(pool, 3)])  # second chunk
    check_kv_accounting(pool, cache, 3)
    match2 = cache.cache_unfinished(key, kv, match.last_node)
    assert match2.kv_indices.tolist() == kv.tolist()
    assert cache.protected_size() == 6 and cache.evictable_size() == 0
    check_kv_accounting(pool, cache, 0)
    kv = torch.cat([match2.kv_indices, alloc(pool, 1)])  # a decoded token
    cache.cache_finished([*key, 1], kv, match2.last_node)
    assert cache.protected_size() == 0 and cache.evictable_size() == 7
    check_kv_accounting(pool, cache, 0)


def test_cache_unfinished_returns_the_trees_slots_for_duplicates() -> None:
    pool, cache = make(16)
    other = put(pool, cache, [1, 2, 3, 4])  # inserted by another request meanwhile
    mine = alloc(pool, 5)
    match = cache.cache_unfinished([1, 2, 3, 4, 5], mine, None)
    assert match.kv_indices.tolist() == [*other.tolist(), mine[4].item()]
    assert pool.available_size() == 16 - 5  # mine[:4] went back to the pool
    assert cache.protected_size() == 5
    check_kv_accounting(pool, cache, 0)
    cache.dec_lock_ref(match.last_node)


def test_cache_finished_rejects_a_changed_locked_prefix() -> None:
    pool, cache = make(16)
    put(pool, cache, [1, 2, 3])
    match = cache.match_prefix([1, 2, 3])
    cache.inc_lock_ref(match.last_node)
    with pytest.raises(ValueError, match="locked prefix"):
        cache.cache_finished(
            [1, 9, 9], torch.cat([match.kv_indices[:1], alloc(pool, 2)]), match.last_node
        )


def test_reset() -> None:
    pool, cache = make(16)
    put(pool, cache, [1, 2, 3])
    put(pool, cache, [1, 4])
    node = cache.match_prefix([1, 4]).last_node
    cache.inc_lock_ref(node)
    with pytest.raises(RuntimeError):
        cache.reset()
    cache.dec_lock_ref(node)
    cache.reset()
    assert cache.total_size() == 0 and pool.available_size() == 16
    assert cache.match_prefix([1, 2, 3]).kv_indices.numel() == 0
    check_kv_accounting(pool, cache, 0)
    put(pool, cache, [1, 2])
    check_kv_accounting(pool, cache, 0)


def test_check_integrity_catches_corruption() -> None:
    pool, cache = make(16)
    slots = put(pool, cache, [1, 2, 3])
    put(pool, cache, [1, 5])
    cache._evictable_size += 1
    with pytest.raises(AssertionError):
        cache.check_integrity()
    cache._evictable_size -= 1
    pool.free(slots[2:])  # a slot the tree owns is freed behind its back
    with pytest.raises(AssertionError):
        cache.check_integrity()


def test_check_kv_accounting_catches_a_leak() -> None:
    pool, cache = make(16)
    put(pool, cache, [1, 2])
    alloc(pool, 3)  # never handed back nor counted as held
    with pytest.raises(AssertionError, match="leak"):
        check_kv_accounting(pool, cache, 0)
    check_kv_accounting(pool, cache, 3)


def test_deep_paths_do_not_recurse() -> None:
    pool, cache = make(3000)
    key = list(range(2500))
    put(pool, cache, key)
    for n in range(1, 2500, 3):  # one node per few tokens
        cache.match_prefix(key[:n] + [-1])
    cache.check_integrity()
    assert cache.evict(3000) == 2500


@pytest.mark.parametrize("disable", [False, True])
def test_create_prefix_cache(disable: bool) -> None:
    pool, _ = make()
    cache: BasePrefixCache = create_prefix_cache(pool, disable_radix_cache=disable)
    assert isinstance(cache, ChunkCache if disable else RadixCache)
