"""Admission policy: in which order waiting requests enter, and how much to reserve.

`fcfs` admits in arrival order (retracted requests keep their original place,
so they resume first). `lpm` admits the longest cached prefix first, which
keeps shared prefixes hot in the cache. Under either policy, Batch API
requests (background traffic) come after every online request; a simple
two-level priority (SGLang's per-request `priority` is another matter).

Admission reserves KV for the tokens running requests will still decode,
scaled by `new_token_ratio`: most requests stop well before max_new_tokens,
so reserving all of it would waste memory, and reserving none would make
retraction the normal case. The ratio jumps up after a retraction and decays
back, as SGLang does.
"""

from __future__ import annotations

from collections.abc import Callable

from radixlm.scheduler.request import Req

POLICIES = ("fcfs", "lpm")


def order_waiting(waiting: list[Req], policy: str, prefix_hit_len: Callable[[Req], int]) -> None:
    """Sort `waiting` in place into admission order: online requests before Batch API
    traffic (`Req.background`), each in policy order."""
    if policy == "lpm" and len(waiting) > 1:
        hits = {id(r): prefix_hit_len(r) for r in waiting}
        waiting.sort(key=lambda r: (r.background, -hits[id(r)], r.arrival_seq))
    else:
        waiting.sort(key=lambda r: (r.background, r.arrival_seq))


class NewTokenRatio:
    """Fraction of the remaining max_new_tokens reserved per running request."""

    def __init__(self, init: float = 0.5, floor: float = 0.1, decay: float = 0.002) -> None:
        self.init = init
        self.floor = min(floor, init)
        self.decay = decay
        self.value = init

    def step(self) -> None:
        self.value = max(self.floor, self.value - self.decay)

    def on_retract(self) -> None:
        self.value = max(self.value, min(1.0, self.init + 0.3))

    def reserve(self, reqs: list[Req]) -> int:
        return int(self.value * sum(r.remaining_new_tokens for r in reqs))
