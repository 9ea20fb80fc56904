"""The reader/writer lock over the served weights (SGLang's discipline for updates).

Generate and encode calls hold the weights while they run, any number at
once. A weight update first stops new calls from starting (they wait until
it is done), then waits until no call holds the weights, and only then swaps
them, so every request runs on one set of weights. One update runs at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class WeightsLock:
    def __init__(self) -> None:
        self._num_holding = 0
        self._free = asyncio.Event()  # set while no call holds the weights
        self._free.set()
        self._no_update = asyncio.Event()  # set while no update is under way
        self._no_update.set()
        self._update_lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def holding(self) -> AsyncIterator[None]:
        """Hold the weights for one call (once any update under way is done)."""
        await self._no_update.wait()
        self._num_holding += 1
        self._free.clear()
        try:
            yield
        finally:
            self._num_holding -= 1
            if self._num_holding == 0:
                self._free.set()

    @contextlib.asynccontextmanager
    async def updating(self) -> AsyncIterator[None]:
        """Be the one update under way: new calls wait from entry to exit. Call
        `wait_free` inside before swapping the weights."""
        async with self._update_lock:
            self._no_update.clear()
            try:
                yield
            finally:
                self._no_update.set()

    async def wait_free(self) -> None:
        """Wait until no call holds the weights."""
        await self._free.wait()
