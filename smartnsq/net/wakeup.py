"""A wake-up call for one long-lived task, cheap to keep.

``anyio.Event`` on asyncio holds an ``asyncio.Event`` with its waiter deque, about 0.9 KB,
for as long as it lives; a consumer's long-lived tasks each keep one, and a process with
1,000 consumers kept thousands. :class:`Wakeup` holds nothing but a flag until its task
waits, and then, on asyncio, a bare future.
"""

from __future__ import annotations

import asyncio

import anyio
import anyio.lowlevel

from smartnsq.net.transport import running_on_asyncio

__all__ = ["Wakeup"]


class Wakeup:
    """Set from anywhere on the loop's thread (a transport callback too); awaited by one task
    at a time. :meth:`wait` returns once it is set and clears it again."""

    __slots__ = ("_set", "_waiter")

    def __init__(self) -> None:
        self._set = False
        self._waiter: asyncio.Future[None] | anyio.Event | None = None

    def is_set(self) -> bool:
        return self._set

    def clear(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True
        waiter = self._waiter
        if waiter is None:
            return
        self._waiter = None
        if isinstance(waiter, asyncio.Future):
            if not waiter.done():
                waiter.set_result(None)
        else:
            waiter.set()

    async def wait(self) -> None:
        """Until :meth:`set` (at once if it was set since the last wait), then clear it."""
        if not self._set:
            if running_on_asyncio():
                waiter: asyncio.Future[None] | anyio.Event = (
                    asyncio.get_running_loop().create_future()
                )
            else:
                waiter = anyio.Event()
            self._waiter = waiter
            try:
                await (waiter if isinstance(waiter, asyncio.Future) else waiter.wait())
            finally:
                if self._waiter is waiter:
                    self._waiter = None
        else:
            await anyio.lowlevel.checkpoint()
        self._set = False
