"""The budget of one step: tokens to compute and KV slots, checked and taken in pairs.

`schedule()` opens a `StepBudget` with the step's token budget
(`--max-prefill-tokens`) and the KV slots a step could get (free ones plus
what eviction could free). Every share of the step is first checked
(`can_extend`, `can_admit`) and only then taken (`extend`, `admit`), so a
refusal leaves nothing to roll back.

Admitting a request locks its cached prefix, which takes the unlocked part of
that prefix out of what eviction could free: `admit` charges that
`lock_cost` to the slots, and `can_admit` counts it before the lock happens.
Admission also keeps `reserve` slots for the tokens running requests will
still decode (see policy.NewTokenRatio), except for the first request of an
idle scheduler.
"""

from __future__ import annotations


class StepBudget:
    def __init__(self, num_tokens: int, num_slots: int, chunk_size: int) -> None:
        """num_tokens: tokens the step may compute; num_slots: KV slots it may use;
        chunk_size: most tokens one request's prefill takes per step."""
        self.num_tokens_left = num_tokens
        self.num_slots_left = num_slots
        self.chunk_size = chunk_size

    @property
    def has_tokens(self) -> bool:
        return self.num_tokens_left > 0

    def chunk_len(self, num_pending: int) -> int:
        """Tokens a request with `num_pending` tokens to compute gets this step."""
        return min(num_pending, self.chunk_size, self.num_tokens_left)

    def add_decode(self) -> None:
        """One decode token: it always fits (retraction made room for every decode first)."""
        self.num_tokens_left -= 1
        self.num_slots_left -= 1

    def num_draft_rows(self, num_wanted: int) -> int:
        """How many of `num_wanted` drafted tokens the step can still verify (each one is
        a token computed and a KV slot, like any extend); take them with `extend`."""
        return max(min(num_wanted, self.num_tokens_left, self.num_slots_left), 0)

    def can_extend(self, num_tokens: int) -> bool:
        return 0 < num_tokens <= self.num_slots_left

    def extend(self, num_tokens: int) -> None:
        self.num_tokens_left -= num_tokens
        self.num_slots_left -= num_tokens

    def can_admit(self, num_tokens: int, lock_cost: int, reserve: int | None) -> bool:
        """Whether a waiting request fits: `num_tokens` now, `lock_cost` slots its prefix
        lock takes from eviction, and `reserve` slots kept for running requests (None
        when nothing runs)."""
        num_slots = self.num_slots_left - lock_cost
        if num_slots < num_tokens:
            return False
        return reserve is None or num_slots - reserve >= num_tokens

    def admit(self, num_tokens: int, lock_cost: int) -> None:
        self.num_slots_left -= lock_cost
        self.extend(num_tokens)
