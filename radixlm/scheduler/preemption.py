"""Priority preemption: which running requests to retract so an urgent one fits.

With priority scheduling (see policy.py), the most urgent waiting request
that cannot be admitted now, for want of a request slot or of KV for its
next chunk plus the reserve running requests keep, may preempt running
requests less urgent than it by more than the threshold: they are retracted
to the waiting queue, least urgent (then newest) first, until it fits. If
retracting every one of them would not make room, none is retracted, as
SGLang's `preempt_to_schedule` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from radixlm.scheduler.request import Req


class RoomNeeded(NamedTuple):
    """What admitting the urgent request takes now."""

    num_tokens: int  # its next chunk
    num_available: int  # KV slots a step could get, less what locking its prefix takes
    has_free_row: bool  # a request row is free in the pool
    max_running: int  # --max-running-requests


def preemption_victims(urgent: Req, running: list[Req], candidates: list[Req],
                       room: RoomNeeded, reserve: Callable[[list[Req]], int]) -> list[Req]:
    """The running requests to retract for `urgent` (candidates: those it may preempt,
    in retraction order), or [] when it fits already or cannot be made to fit.

    reserve(reqs): the KV that admission keeps for the future tokens of `reqs`.
    """
    remaining, chosen = list(running), list[Req]()
    num_available = room.num_available
    pending = list(candidates)
    while True:
        num_decodes = sum(1 for r in remaining if r.num_pending_tokens == 1)
        kept = reserve(remaining + [urgent]) if remaining else 0
        has_row = len(remaining) < room.max_running and (bool(chosen) or room.has_free_row)
        if has_row and num_available - num_decodes - kept >= room.num_tokens:
            return chosen
        if not pending:
            return []
        victim = pending.pop(0)
        chosen.append(victim)
        remaining.remove(victim)
        # Its own slots go back, and its prefix becomes evictable unless another running
        # request shares it (then this overestimates; a later step preempts again).
        num_available += victim.kv_len
