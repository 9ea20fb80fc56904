"""RadixCache against a reference model, over random sequences of scheduler-like operations.

The model is a dict from every cached token prefix to the KV slot the tree
holds for its last token (prefix-closed, like the tree). Every slot also
records the prefix whose KV it was allocated for, so a slot freed while still
in use and then reallocated shows up as a wrong prefix. After every operation:
the tree equals the model, check_integrity passes, and the accounting identity
holds with "held" = slots the requests allocated beyond their locked prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixlm.mem_cache import RadixCache, TokenToKVPool, check_kv_accounting

Prefix = tuple[int, ...]
POOL_SIZE = 40
tokens = st.lists(st.integers(0, 2), min_size=0, max_size=8)


@dataclass
class Req:
    key: list[int]  # tokens with KV
    kv: list[int]  # their slots
    num_locked: int  # leading slots owned by the cache, under the lock on `node`
    node: Any


def tree_dict(cache: RadixCache) -> dict[Prefix, int]:
    out: dict[Prefix, int] = {}
    stack: list[tuple[Prefix, Any]] = [((), cache.root)]
    while stack:
        prefix, node = stack.pop()
        for child in node.children.values():
            path = prefix
            for tok, slot in zip(child.key, child.value.tolist(), strict=True):
                path = (*path, tok)
                out[path] = slot
            stack.append((path, child))
    return out


class RadixCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool = TokenToKVPool(POOL_SIZE, 1, 1, 1, torch.float32, debug=True)
        self.cache = RadixCache(self.pool)
        self.model: dict[Prefix, int] = {}
        self.slot_prefix: dict[int, Prefix] = {}  # what each allocated slot holds the KV of
        self.reqs: list[Req] = []

    # ---- helpers ----

    def expected_match(self, key: list[int]) -> list[int]:
        slots = []
        for i in range(len(key)):
            slot = self.model.get(tuple(key[: i + 1]))
            if slot is None:
                break
            slots.append(slot)
        return slots

    def alloc_for(self, key: list[int], start: int) -> list[int] | None:
        """Slots for key[start:], evicting if needed; None if even eviction cannot make room."""
        n = len(key) - start
        if self.pool.available_size() < n:
            self.evict_and_check(n - self.pool.available_size())
        slots = self.pool.alloc(n)
        if slots is None:
            return None
        for i, slot in enumerate(slots.tolist()):
            self.slot_prefix[slot] = tuple(key[: start + i + 1])
        return slots.tolist()

    def evict_and_check(self, num_tokens: int) -> None:
        locked = {tuple(r.key[:i]) for r in self.reqs for i in range(1, r.num_locked + 1)}
        evictable_before = self.cache.evictable_size()
        freed = self.cache.evict(num_tokens)
        after = tree_dict(self.cache)
        removed = set(self.model) - set(after)
        assert all(self.model[p] == s for p, s in after.items()), "eviction changed a slot"
        assert not removed & locked, "evicted a locked prefix"
        assert freed == len(removed) >= min(num_tokens, evictable_before)
        self.model = after

    def model_insert(self, key: list[int], kv: list[int]) -> None:
        for i, slot in enumerate(kv):
            self.model.setdefault(tuple(key[: i + 1]), slot)

    # ---- operations ----

    @rule(key=tokens)
    def start(self, key: list[int]) -> None:
        match = self.cache.match_prefix(key)
        assert match.kv_indices.tolist() == self.expected_match(key)
        self.cache.inc_lock_ref(match.last_node)
        num_locked = match.kv_indices.numel()
        self.reqs.append(
            Req(key[:num_locked], match.kv_indices.tolist(), num_locked, match.last_node)
        )
        self.extend_req(len(self.reqs) - 1, key[num_locked:])

    @precondition(lambda self: self.reqs)
    @rule(i=st.integers(0, 100), extra=tokens)
    def extend(self, i: int, extra: list[int]) -> None:
        self.extend_req(i % len(self.reqs), extra)

    def extend_req(self, i: int, extra: list[int]) -> None:
        req = self.reqs[i]
        new_key = req.key + extra
        slots = self.alloc_for(new_key, len(req.key))
        if slots is not None:  # else the request waits, as a scheduler would make it
            req.key, req.kv = new_key, req.kv + slots

    @precondition(lambda self: self.reqs)
    @rule(i=st.integers(0, 100))
    def cache_unfinished(self, i: int) -> None:
        req = self.reqs[i % len(self.reqs)]
        self.model_insert(req.key, req.kv)
        match = self.cache.cache_unfinished(
            req.key, torch.tensor(req.kv, dtype=torch.int64), req.node
        )
        assert match.kv_indices.tolist() == self.expected_match(req.key)
        req.kv, req.num_locked, req.node = match.kv_indices.tolist(), len(req.key), match.last_node

    @precondition(lambda self: self.reqs)
    @rule(i=st.integers(0, 100))
    def cache_finished(self, i: int) -> None:
        req = self.reqs.pop(i % len(self.reqs))
        self.model_insert(req.key, req.kv)
        self.cache.cache_finished(req.key, torch.tensor(req.kv, dtype=torch.int64), req.node)

    @rule(key=tokens)
    def match(self, key: list[int]) -> None:
        assert self.cache.match_prefix(key).kv_indices.tolist() == self.expected_match(key)

    @rule(num_tokens=st.integers(0, POOL_SIZE))
    def evict(self, num_tokens: int) -> None:
        self.evict_and_check(num_tokens)

    @rule()
    def reset(self) -> None:
        if self.cache.protected_size():
            return  # reset requires no locks (the scheduler flushes only when idle)
        self.cache.reset()
        self.model = {}

    # ---- invariants ----

    @invariant()
    def tree_matches_model(self) -> None:
        assert tree_dict(self.cache) == self.model
        for prefix, slot in self.model.items():
            assert self.slot_prefix[slot] == prefix, "a cached slot holds another prefix's KV"
        for req in self.reqs:
            for i, slot in enumerate(req.kv):
                assert self.slot_prefix[slot] == tuple(req.key[: i + 1])

    @invariant()
    def accounting(self) -> None:
        held = sum(len(r.kv) - r.num_locked for r in self.reqs)
        check_kv_accounting(self.pool, self.cache, held)
        locked = len({tuple(r.key[:i]) for r in self.reqs for i in range(1, r.num_locked + 1)})
        assert self.cache.protected_size() == locked


RadixCacheMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRadixCacheModel = RadixCacheMachine.TestCase
