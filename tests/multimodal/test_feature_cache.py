"""The vision feature cache: LRU order, a byte bound, hit and miss counts."""

from __future__ import annotations

import torch

from radixlm.multimodal.feature_cache import FeatureCache


def _features(num_rows: int) -> torch.Tensor:
    return torch.zeros(num_rows, 4)  # 16 bytes a row


def test_get_counts_hits_and_misses() -> None:
    cache = FeatureCache(max_bytes=1024)
    assert cache.get(1) is None
    features = _features(2)
    cache.put(1, features)
    assert cache.get(1) is features
    assert (cache.num_hits, cache.num_misses, cache.num_bytes) == (1, 1, 32)


def test_evicts_least_recently_used_to_fit() -> None:
    cache = FeatureCache(max_bytes=100)
    for key in (1, 2, 3):
        cache.put(key, _features(2))  # 32 bytes each: 96 in all
    cache.get(1)  # 2 is now the least recently used
    cache.put(4, _features(2))
    assert 2 not in cache and {1, 3, 4} == {k for k in (1, 2, 3, 4) if k in cache}
    assert cache.num_bytes == 96
    cache.put(5, _features(5))  # 80 bytes: evicts 3, 1 and 4
    assert len(cache) == 1 and 5 in cache and cache.num_bytes == 80


def test_too_large_is_not_stored_and_replacing_keeps_the_count() -> None:
    cache = FeatureCache(max_bytes=64)
    cache.put(1, _features(5))
    assert len(cache) == 0 and cache.num_bytes == 0
    cache.put(2, _features(1))
    cache.put(2, _features(3))
    assert cache.num_bytes == 48
    cache.clear()
    assert len(cache) == 0 and cache.num_bytes == 0
