"""RadixCache: a radix tree over token ids whose values are KV slots (page size 1).

Each non-root node holds a non-empty run of tokens (`key`) and their KV slots
(`value`, same length); a node's children start with distinct tokens, so
`children` is keyed by first token. The path from the root to a node spells
the token prefix whose KV that path holds.

Matching or inserting a key that ends inside a node splits the node there, so
every matched prefix ends exactly at a node, the one a request locks. A split
keeps the original object as the lower half: a request's `last_node` keeps
meaning the same prefix however the tree is split later.

Locks are reference counts on the whole root path: `inc_lock_ref(n)` raises
n and every ancestor by one. Hence a parent's count is at least the sum of its
children's, and a node is evictable exactly when its count is zero. Eviction
pops unlocked leaves from a heap ordered by last access (a logical clock that
match and insert advance), and a parent that becomes an unlocked leaf joins
the heap. The set of unlocked leaves is kept incrementally, so eviction does
not walk the tree. An `eviction_sink` (the disk tier) sees each leaf before
it goes, while its slots still hold its KV.
"""

from __future__ import annotations

import heapq
import itertools
from typing import NamedTuple, Protocol

import torch

from radixlm.mem_cache.base_prefix_cache import BasePrefixCache, MatchResult
from radixlm.mem_cache.memory_pool import TokenToKVPool


class TreeNode:
    """One run of tokens and their KV slots; `lock_ref` counts locks at or below this node."""

    __slots__ = ("id", "key", "value", "parent", "children", "lock_ref", "last_access_time")

    def __init__(self, node_id: int, key: list[int], value: torch.Tensor, parent: TreeNode | None):
        self.id = node_id
        self.key = key
        self.value = value  # [len(key)] int64 KV slots
        self.parent = parent
        self.children: dict[int, TreeNode] = {}
        self.lock_ref = 0
        self.last_access_time = 0

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, len={len(self.key)}, lock_ref={self.lock_ref})"


class EvictionSink(Protocol):
    def on_evict(self, key: list[int], kv_indices: torch.Tensor, start: int) -> None:
        """A leaf is leaving the pool: `key` is its whole path's tokens, `kv_indices`
        ([len(key)] int64) the path's slots, and the leaf holds positions
        [start, len(key)). Its slots are freed when eviction returns: copy now."""


class _InsertResult(NamedTuple):
    prefix_len: int  # leading tokens of the key that were already cached
    values: list[torch.Tensor]  # the cache's slots for the whole key, node by node
    last_node: TreeNode  # the node where the key ends (the root for an empty key)


def _common_prefix_len(node_key: list[int], key: list[int], start: int) -> int:
    """Length of the common prefix of node_key and key[start:]."""
    n = min(len(node_key), len(key) - start)
    i = 0
    while i < n and node_key[i] == key[start + i]:
        i += 1
    return i


class RadixCache(BasePrefixCache):
    """Prefix sharing through a radix tree; see the module docstring for the invariants."""

    def __init__(self, kv_pool: TokenToKVPool, eviction_sink: EvictionSink | None = None) -> None:
        super().__init__(kv_pool)
        self.eviction_sink = eviction_sink
        self._node_ids = itertools.count()
        self._clock = itertools.count(1)
        empty = torch.empty(0, dtype=torch.int64, device=self.kv_pool.device)
        # NOTE: the root is never replaced (reset empties it), so a request's
        # last_node that is the root stays valid across a flush.
        self.root = TreeNode(next(self._node_ids), [], empty, None)
        self._init_tree()

    def _init_tree(self) -> None:
        self.root.children = {}
        self._evictable_size = 0
        self._protected_size = 0
        self._evictable_leaves: set[TreeNode] = set()

    # ---- lookup and insertion ----

    def match_prefix(self, key: list[int]) -> MatchResult:
        node, _, values = self._walk(key, next(self._clock))
        return MatchResult(self._cat(values), node)

    def insert(self, key: list[int], kv_indices: torch.Tensor) -> int:
        return self._insert(key, kv_indices).prefix_len

    def _insert(self, key: list[int], kv_indices: torch.Tensor) -> _InsertResult:
        if len(key) != kv_indices.numel():
            raise ValueError(f"key has {len(key)} tokens but {kv_indices.numel()} KV slots")
        now = next(self._clock)
        node, prefix_len, values = self._walk(key, now)
        if prefix_len < len(key):
            node = self._add_leaf(node, key[prefix_len:], kv_indices[prefix_len:], now)
            values.append(node.value)
        return _InsertResult(prefix_len, values, node)

    def _walk(self, key: list[int], now: int) -> tuple[TreeNode, int, list[torch.Tensor]]:
        """Follow key from the root as far as the tree has it, splitting a node matched in part.

        Returns the node where the match ends, the number of tokens matched and
        the matched nodes' values; stamps the matched path with time `now`.
        """
        node, pos = self.root, 0
        values: list[torch.Tensor] = []
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                break
            n = _common_prefix_len(child.key, key, pos)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access_time = now
            values.append(child.value)
            node, pos = child, pos + n
        return node, pos, values

    def _split(self, node: TreeNode, n: int) -> TreeNode:
        """Split node after its first n tokens (0 < n < len); return the new upper half."""
        parent = node.parent
        assert parent is not None and 0 < n < len(node.key)
        upper = TreeNode(next(self._node_ids), node.key[:n], node.value[:n], parent)
        upper.lock_ref = node.lock_ref
        upper.last_access_time = node.last_access_time
        upper.children[node.key[n]] = node
        parent.children[node.key[0]] = upper
        node.parent = upper
        node.key = node.key[n:]
        node.value = node.value[n:]
        return upper

    def _add_leaf(
        self, parent: TreeNode, key: list[int], value: torch.Tensor, now: int
    ) -> TreeNode:
        leaf = TreeNode(next(self._node_ids), list(key), value.to(torch.int64).clone(), parent)
        leaf.last_access_time = now
        parent.children[key[0]] = leaf
        self._evictable_size += len(key)
        self._evictable_leaves.discard(parent)
        self._evictable_leaves.add(leaf)
        return leaf

    # ---- request hand-over ----

    def cache_unfinished(
        self, key: list[int], kv_indices: torch.Tensor, last_node: TreeNode | None
    ) -> MatchResult:
        result = self._insert_and_free_duplicates(key, kv_indices, last_node)
        self.inc_lock_ref(result.last_node)
        self.dec_lock_ref(last_node)
        return MatchResult(self._cat(result.values), result.last_node)

    def cache_finished(
        self, key: list[int], kv_indices: torch.Tensor, last_node: TreeNode | None
    ) -> None:
        self._insert_and_free_duplicates(key, kv_indices, last_node)
        self.dec_lock_ref(last_node)

    def _insert_and_free_duplicates(
        self, key: list[int], kv_indices: torch.Tensor, last_node: TreeNode | None
    ) -> _InsertResult:
        # The request's first `num_locked` slots are the cache's own (from its match);
        # its slots for [num_locked, prefix_len) duplicate slots the cache already holds.
        num_locked = self._depth(last_node)
        result = self._insert(key, kv_indices)
        if result.prefix_len < num_locked:
            raise ValueError(
                f"key no longer starts with the locked prefix ({num_locked} tokens, "
                f"{result.prefix_len} match): the request changed tokens the cache owns"
            )
        if result.prefix_len > num_locked:
            self.kv_pool.free(kv_indices[num_locked : result.prefix_len])
        return result

    def _depth(self, node: TreeNode | None) -> int:
        """Tokens on the path from the root to node."""
        depth = 0
        while node is not None:
            depth += len(node.key)
            node = node.parent
        return depth

    # ---- locks ----

    def inc_lock_ref(self, node: TreeNode | None) -> None:
        while node is not None and node is not self.root:
            if node.lock_ref == 0:
                self._evictable_size -= len(node.key)
                self._protected_size += len(node.key)
                self._evictable_leaves.discard(node)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode | None) -> None:
        while node is not None and node is not self.root:
            if node.lock_ref <= 0:
                raise ValueError(f"unlocking {node}, which is not locked")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable_size += len(node.key)
                self._protected_size -= len(node.key)
                if not node.children:
                    self._evictable_leaves.add(node)
            node = node.parent

    def lock_cost(self, node: TreeNode | None) -> int:
        cost = 0
        while node is not None and node is not self.root:
            if node.lock_ref == 0:
                cost += len(node.key)
            node = node.parent
        return cost

    # ---- eviction ----

    def evict(self, num_tokens: int) -> int:
        if num_tokens <= 0 or not self._evictable_leaves:
            return 0
        heap = [(n.last_access_time, n.id, n) for n in self._evictable_leaves]
        heapq.heapify(heap)
        freed: list[torch.Tensor] = []
        num_freed = 0
        while num_freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            if self.eviction_sink is not None:
                self._offer_to_sink(leaf)
            self._remove_leaf(leaf)
            freed.append(leaf.value)
            num_freed += len(leaf.key)
            if parent in self._evictable_leaves:
                heapq.heappush(heap, (parent.last_access_time, parent.id, parent))
        self.kv_pool.free(torch.cat(freed))
        return num_freed

    def _offer_to_sink(self, leaf: TreeNode) -> None:
        assert self.eviction_sink is not None
        keys: list[list[int]] = []
        values: list[torch.Tensor] = []
        node: TreeNode | None = leaf
        while node is not None and node is not self.root:
            keys.append(node.key)
            values.append(node.value)
            node = node.parent
        key = [t for k in reversed(keys) for t in k]
        self.eviction_sink.on_evict(key, torch.cat(values[::-1]), len(key) - len(leaf.key))

    def _remove_leaf(self, leaf: TreeNode) -> None:
        parent = leaf.parent
        assert parent is not None and not leaf.children and leaf.lock_ref == 0
        del parent.children[leaf.key[0]]
        leaf.parent = None
        self._evictable_size -= len(leaf.key)
        self._evictable_leaves.discard(leaf)
        if parent is not self.root and not parent.children and parent.lock_ref == 0:
            self._evictable_leaves.add(parent)

    # ---- sizes, reset, checks ----

    def evictable_size(self) -> int:
        return self._evictable_size

    def protected_size(self) -> int:
        return self._protected_size

    def reset(self) -> None:
        if self._protected_size:
            raise RuntimeError(f"reset with {self._protected_size} locked tokens in the cache")
        values = [node.value for node in self._nodes()]
        if values:
            self.kv_pool.free(torch.cat(values))
        self._init_tree()

    def _nodes(self) -> list[TreeNode]:
        """Every node but the root (iterative: paths can be deep)."""
        nodes: list[TreeNode] = []
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            nodes.append(node)
            stack.extend(node.children.values())
        return nodes

    def check_integrity(self) -> None:
        root = self.root
        assert root.parent is None and not root.key and root.lock_ref == 0, "root modified"
        evictable = protected = 0
        leaves: set[TreeNode] = set()
        values: list[torch.Tensor] = []
        for node in [root, *self._nodes()]:
            for first, child in node.children.items():
                assert child.parent is node, f"{child} has the wrong parent"
                assert child.key and child.key[0] == first, f"{child} is filed under {first}"
            child_locks = sum(c.lock_ref for c in node.children.values())
            if node is root:
                continue
            assert len(node.key) == node.value.numel(), f"{node}: key and value lengths differ"
            assert node.lock_ref >= child_locks, f"{node}: fewer locks than its children"
            if node.lock_ref == 0:
                evictable += len(node.key)
                if not node.children:
                    leaves.add(node)
            else:
                protected += len(node.key)
            values.append(node.value)
        assert evictable == self._evictable_size, f"evictable {self._evictable_size} != {evictable}"
        assert protected == self._protected_size, f"protected {self._protected_size} != {protected}"
        assert leaves == self._evictable_leaves, "the set of evictable leaves is stale"
        self._check_slots(self._cat(values))

    def _check_slots(self, slots: torch.Tensor) -> None:
        """No slot held twice by the tree, none out of range, none also free in the pool."""
        if slots.numel() == 0:
            return
        assert torch.unique(slots).numel() == slots.numel(), "a KV slot is held twice by the tree"
        assert int(slots.min()) >= 1 and int(slots.max()) <= self.kv_pool.size, "slot out of range"
        free = self.kv_pool.free_slots()
        assert not bool(torch.isin(slots, free).any()), "a slot owned by the tree is also free"

    def _cat(self, values: list[torch.Tensor]) -> torch.Tensor:
        """A new tensor (never a view of a node's value, which callers could then modify)."""
        if not values:
            return torch.empty(0, dtype=torch.int64, device=self.kv_pool.device)
        return torch.cat(values)
