"""Control requests from the TokenizerManager to the scheduler, and their replies.

Server info, cache flushes, weight updates and profiling go to the scheduler
between its steps; it answers each kind in the order asked, so a reply goes
to the oldest call waiting for a reply of its type. If the engine dies, every
waiting call fails with the death's error.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

import zmq.asyncio

ReplyT = TypeVar("ReplyT")


class ControlChannel:
    def __init__(self, to_scheduler: zmq.asyncio.Socket) -> None:
        self.to_scheduler = to_scheduler
        self.waiters: dict[type, list[asyncio.Future[Any]]] = {}

    async def call(self, msg: object, reply_type: type[ReplyT],
                   timeout: float = 60.0) -> ReplyT:
        """Send a control message and wait for the scheduler's reply of `reply_type`."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiters.setdefault(reply_type, []).append(future)
        self.to_scheduler.send_pyobj(msg)
        reply = await asyncio.wait_for(future, timeout)
        assert isinstance(reply, reply_type)
        return reply

    def answer(self, msg: object) -> None:
        """Hand a reply to the oldest call waiting for its type (none waits: dropped)."""
        if type(msg) in self.waiters and self.waiters[type(msg)]:
            future = self.waiters[type(msg)].pop(0)
            if not future.done():
                future.set_result(msg)

    def fail_all(self, error: Exception) -> None:
        """Fail every waiting call with `error` (the engine died)."""
        for waiters in self.waiters.values():
            for future in waiters:
                if not future.done():
                    future.set_exception(error)
