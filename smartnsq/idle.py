"""Consumer workers waiting for the next message, and waking one of them.

On asyncio each wait is a future: it costs about half of an ``anyio.Event`` (3.4 against
7.7 µs per wake, measured), which counts when every ordered message wakes a worker. It is the
connection's eager future, so an ordered message can resume its worker right in the read
callback (the worker's task runs as itself, as the loop would run it one pass later). On
other backends (trio) it is an ``anyio.Event``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import anyio

from smartnsq.connection import _EagerFuture


class IdleWorkers:
    __slots__ = ("_loop", "_waiting")

    def __init__(self) -> None:
        self._waiting: deque[Any] = deque()
        self._loop: asyncio.AbstractEventLoop | bool | None = None  # False: not asyncio

    def __len__(self) -> int:
        return len(self._waiting)

    async def wait(self) -> None:
        """Sleep until :meth:`wake_one` or :meth:`wake_all` picks this waiter."""
        loop = self._loop
        if loop is None:
            try:
                loop = self._loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = self._loop = False
        if loop:
            assert isinstance(loop, asyncio.AbstractEventLoop)
            future = _EagerFuture(loop=loop)
            self._waiting.append(future)
            await future  # a cancelled waiter's future is done: wake_one skips it
        else:
            event = anyio.Event()
            self._waiting.append(event)
            try:
                await event.wait()
            except BaseException:  # cancelled: a later wake_one must not pick this one
                if not event.is_set():
                    self._waiting.remove(event)
                raise

    def wake_one(self, eager: bool = False) -> None:
        """Wake the longest waiting worker; ``eager``: from a transport callback, run it
        there and then (elsewhere, and when not eager, on the loop's next pass)."""
        waiting = self._waiting
        if self._loop:
            while waiting:
                future = waiting.popleft()
                if not future.done():
                    future.set_result(None)
                    if eager:
                        future.wake()
                    else:
                        future.schedule()
                    return
        elif waiting:
            waiting.popleft().set()

    def wake_all(self) -> None:
        while self._waiting:
            self.wake_one()
