"""n > 1: the samples of one prompt share its prefill.

The TokenizerManager sends a request with `n` samples as n requests with one
`group_id`. With prefix sharing on, the first sample admitted (the leader)
prefills the prompt; the others wait until the group is ready: the prompt
is in the prefix cache (the leader's prefill reached its last token) or a
member finished. Each then computes only the last prompt token. Without
prefix sharing every sample prefills on its own.
"""

from __future__ import annotations

from radixlm.scheduler.request import Req


class SampleGroups:
    def __init__(self, shares_prefixes: bool) -> None:
        self.shares_prefixes = shares_prefixes
        self.leader: dict[str, str] = {}  # group id -> rid of the sample that prefills
        self.ready: set[str] = set()  # groups whose prompt followers may share now
        self.remaining: dict[str, int] = {}  # group id -> samples not yet finished

    def add(self, req: Req) -> None:
        if req.group_id is not None:
            self.remaining[req.group_id] = self.remaining.get(req.group_id, 0) + 1

    def allows(self, req: Req) -> bool:
        """Whether `req` may be admitted now (followers wait for the leader)."""
        gid = req.group_id
        if gid is None or not self.shares_prefixes or gid in self.ready:
            return True
        return self.leader.setdefault(gid, req.rid) == req.rid

    def on_prefill_progress(self, req: Req) -> None:
        """After `req` cached a prefill chunk: the group is ready once the prompt is in."""
        if req.group_id is not None and req.kv_len >= req.num_prompt_tokens - 1:
            self.ready.add(req.group_id)

    def on_finished(self, req: Req) -> None:
        """A finished member unblocks the rest; the last one forgets the group."""
        gid = req.group_id
        if gid is None:
            return
        self.ready.add(gid)
        left = self.remaining.get(gid, 1) - 1
        if left <= 0:
            self.remaining.pop(gid, None)
            self.leader.pop(gid, None)
            self.ready.discard(gid)
        else:
            self.remaining[gid] = left
