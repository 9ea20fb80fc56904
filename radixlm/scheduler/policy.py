"""Admission policy: in which order waiting requests enter, who is retracted first,
and how much to reserve.

`fcfs` admits in arrival order (retracted requests keep their original place,
so they resume first). `lpm` admits the longest cached prefix first, which
keeps shared prefixes hot in the cache. Under either policy, Batch API
requests (background traffic) come after every online request and are
retracted before them, whatever their priority.

Priority scheduling (`--enable-priority-scheduling`, or `--schedule-policy
priority`), as SGLang does it: a request's `priority` comes first in the
order, larger values more urgent (smaller with
`--schedule-low-priority-values-first`); under memory pressure the least
urgent running request is retracted first (the newest among equals); and a
waiting request that cannot be admitted (no request slot, or not enough KV)
preempts running requests less urgent than it by more than
`--priority-scheduling-preemption-threshold`: they are retracted to the
waiting queue and resume later with nothing lost. Without it every request
has priority 0 and the order is the policy's alone.

Admission reserves KV for the tokens running requests will still decode,
scaled by `new_token_ratio`: most requests stop well before max_new_tokens,
so reserving all of it would waste memory, and reserving none would make
retraction the normal case. The ratio jumps up after a retraction and decays
back, as SGLang does.
"""

from __future__ import annotations

from collections.abc import Callable

from radixlm.scheduler.request import Req

POLICIES = ("fcfs", "lpm", "priority")


class PriorityOrder:
    """The direction of request priorities: `rank(req)` is smaller for more urgent."""

    def __init__(self, enabled: bool, low_values_first: bool = False,
                 preemption_threshold: int = 10, preempts: bool = True) -> None:
        self.enabled = enabled
        self.sign = (1 if low_values_first else -1) if enabled else 0
        self.preemption_threshold = preemption_threshold
        self.preempts = enabled and preempts

    def rank(self, req: Req) -> int:
        return req.priority * self.sign

    def may_preempt(self, urgent: Req, running: Req) -> bool:
        """Whether `urgent` (waiting) outranks `running` by more than the threshold."""
        return self.preempts and self.rank(running) - self.rank(urgent) > self.preemption_threshold

    def retraction_order(self, running: list[Req]) -> list[Req]:
        """Running requests, the first to retract first: Batch API traffic, then the
        least urgent, then the newest."""
        return sorted(running, key=lambda r: (not r.background, -self.rank(r),
                                              -(r.admit_seq or 0)))


def order_waiting(waiting: list[Req], policy: str, prefix_hit_len: Callable[[Req], int],
                  priority: PriorityOrder | None = None) -> None:
    """Sort `waiting` in place into admission order: online requests before Batch API
    traffic (`Req.background`), then by priority rank (all 0 without priority
    scheduling), then the policy's order."""
    rank = priority.rank if priority is not None and priority.enabled else (lambda r: 0)
    if policy == "lpm" and len(waiting) > 1:
        hits = {id(r): prefix_hit_len(r) for r in waiting}
        waiting.sort(key=lambda r: (r.background, rank(r), -hits[id(r)], r.arrival_seq))
    else:
        waiting.sort(key=lambda r: (r.background, rank(r), r.arrival_seq))


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
