"""KV memory: the request and KV-slot pools, and the prefix caches over them."""

from __future__ import annotations

from radixlm.mem_cache.base_prefix_cache import BasePrefixCache, MatchResult, check_kv_accounting
from radixlm.mem_cache.chunk_cache import ChunkCache
from radixlm.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixlm.mem_cache.radix_cache import RadixCache, TreeNode


def create_prefix_cache(
    kv_pool: TokenToKVPool, disable_radix_cache: bool = False
) -> BasePrefixCache:
    """The prefix cache that `--disable-radix-cache` selects."""
    return ChunkCache(kv_pool) if disable_radix_cache else RadixCache(kv_pool)


__all__ = [
    "BasePrefixCache",
    "ChunkCache",
    "MatchResult",
    "RadixCache",
    "ReqToTokenPool",
    "TokenToKVPool",
    "TreeNode",
    "check_kv_accounting",
    "create_prefix_cache",
]
