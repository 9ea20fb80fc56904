"""Retraction: sending running requests back to the waiting queue, and which ones.

A retracted request gives back its row and its KV (to the prefix cache when
prefixes are shared), keeps its tokens, and once admitted again computes
what the cache no longer holds. `Retractor` retracts when the KV pool cannot
hold every decode's next token even after evicting the cache (the least
urgent, then the newest, first; the one request left is aborted instead),
when every running request is mid-prefill and none fits, and for priority
preemption. Only a full pool raises the reserve ratio (policy.py).

With priority scheduling (see policy.py), the most urgent waiting request
that cannot be admitted now, for want of a request slot or of KV for its
next chunk plus the reserve running requests keep, may preempt running
requests less urgent than it by more than the threshold: they are retracted
to the waiting queue, least urgent (then newest) first, until it fits. If
retracting every one of them would not make room, none is retracted, as
SGLang's `preempt_to_schedule` does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

from radixlm.messages.io_struct import FinishReason
from radixlm.scheduler.groups import SampleGroups
from radixlm.scheduler.kv_manager import KVManager
from radixlm.scheduler.policy import NewTokenRatio, PriorityOrder
from radixlm.scheduler.request import Req
from radixlm.server_args import ServerArgs

logger = logging.getLogger("radixlm.scheduler.scheduler")  # log lines keep the scheduler's name


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


class Retractor:
    """Retracts from the scheduler's `running` queue to its `waiting` one (both changed
    in place), and counts what it did."""

    def __init__(self, args: ServerArgs, kv: KVManager, priority: PriorityOrder,
                 new_token_ratio: NewTokenRatio, groups: SampleGroups) -> None:
        self.args = args
        self.kv = kv
        self.priority = priority
        self.new_token_ratio = new_token_ratio
        self.groups = groups
        self.num_retractions = 0
        self.num_preemptions = 0  # retractions for a more urgent request

    def victim(self, running: list[Req]) -> Req:
        """Batch API traffic first, then the least urgent running request (all are equal
        without priority scheduling), the newest among equals."""
        return self.priority.retraction_order(running)[0]

    def preempt_for_urgent(self, running: list[Req], waiting: list[Req]) -> None:
        """Retract running requests so the most urgent waiting one fits (see above)."""
        urgent = min(waiting, key=lambda r: (self.priority.rank(r), r.arrival_seq))
        candidates = [r for r in self.priority.retraction_order(running)
                      if self.priority.may_preempt(urgent, r)]
        if not candidates or not self.groups.allows(urgent):
            return
        match = self.kv.match(urgent)
        room = RoomNeeded(
            num_tokens=min(urgent.num_tokens - len(match.kv_indices),
                           self.args.chunked_prefill_size, self.args.max_prefill_tokens),
            num_available=self.kv.num_available_slots() - match.lock_cost,
            has_free_row=self.kv.has_free_row(), max_running=self.args.max_running_requests)
        for victim in preemption_victims(urgent, running, candidates, room,
                                         self.new_token_ratio.reserve):
            self.retract(victim, running, waiting, f"preempted by {urgent.rid!r} (priority "
                         f"{urgent.priority} over {victim.priority})")
            self.num_preemptions += 1

    def retract_until_decodes_fit(self, running: list[Req], waiting: list[Req]) -> bool:
        """Retract requests (the least urgent, then the newest) until every decode's next
        token has a slot. True when the one request left cannot have one: it is then
        finished with an abort, for the caller to release."""
        while running:
            num_decodes = sum(1 for r in running if r.num_pending_tokens == 1)
            if self.kv.num_available_slots() >= num_decodes:
                return False
            if len(running) == 1:
                running[0].finished_reason = FinishReason(
                    "abort", message="Out of KV cache memory for this request")
                return True
            self.retract(self.victim(running), running, waiting)
        return False

    def retract(self, victim: Req, running: list[Req], waiting: list[Req],
                reason: str | None = None) -> None:
        """Send a running request back to the waiting queue (reason: why, when it is not
        a full KV pool; only a full pool raises the reserve ratio)."""
        running.remove(victim)
        self.kv.release(victim)
        victim.reset_for_retraction()
        waiting.append(victim)
        self.num_retractions += 1
        if reason is None:
            self.new_token_ratio.on_retract()
        logger.info("Retracted %s (%s); %d running", victim.rid, reason or "KV full",
                    len(running))
