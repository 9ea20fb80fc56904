"""One request's drafting state: its n-gram index and the adaptive rule's memory.

The request (scheduler/request.py) holds it; the scheduler's drafter
(scheduler/ngram_drafter.py) creates and updates it.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.speculative.ngram_index import NgramIndex

INITIAL_BACKOFF = 16  # output tokens without drafting after a first low-acceptance spell


@dataclass
class SpecState:
    """One request's drafting state (its n-gram index and the adaptive rule's memory)."""

    index: NgramIndex
    acceptance: float  # exponential average of accepted / drafted per verify
    resume_at: int = 0  # drafting pauses until the output has this many tokens
    backoff: int = INITIAL_BACKOFF
