"""Consumer workers waiting for the next message, and waking one of them.

On asyncio each wait is a future: it costs about half of an ``anyio.Event`` (3.4 against
7.7 µs per wake, measured), which counts when every ordered message wakes a worker. It is an
:class:`~smartnsq.net.eager.EagerFuture`, so an ordered message can resume its worker right in
the read callback (the worker's task runs as itself, as the loop would run it one pass
later). On other backends (trio) it is an ``anyio.Event``.

Even that wake costs about as much as the rest of an ordered message's handling (a future,
a task step, the worker's loop). :meth:`IdleWorkers.run_as_worker` skips it: it runs the
worker's code for one message right in the read callback, as the idle worker's task and in
its context, which is what the task step does; only a handler that has to wait is handed to
the worker itself. Both need :mod:`smartnsq.net.eager`'s mechanisms; without them (its probe
failed, or they are switched off) a wake is a plain future's and ``run_as_worker`` declines.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import anyio

from smartnsq.net import eager
from smartnsq.net.eager import NOT_RUN, EagerFuture, run_as_task

T = TypeVar("T")
Job = Any  # what run_as_worker hands a worker: its wait() returns it


class IdleWorkers:
    __slots__ = ("_loop", "_waiting", "_wake_alls")

    def __init__(self) -> None:
        self._waiting: deque[Any] = deque()
        self._wake_alls = 0  # wake_all calls: see run_as_worker
        self._loop: asyncio.AbstractEventLoop | Literal[False] | None = None  # False: not asyncio

    def __len__(self) -> int:
        return len(self._waiting)

    async def wait(self) -> Job | None:
        """Sleep until :meth:`wake_one` or :meth:`wake_all` picks this waiter (None), or
        :meth:`run_as_worker` hands it a job."""
        loop = self._loop
        if loop is None:
            try:
                loop = self._loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = self._loop = False
            else:
                eager.enabled()  # probed once per process
        if loop:
            assert isinstance(loop, asyncio.AbstractEventLoop)
            future = EagerFuture(loop=loop)
            self._waiting.append(future)
            # a cancelled waiter's future is done: wake_one skips it
            return await future
        else:
            event = anyio.Event()
            self._waiting.append(event)
            try:
                await event.wait()
            except BaseException:  # cancelled: a later wake_one must not pick this one
                if not event.is_set():
                    self._waiting.remove(event)
                raise
        return None

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

    def run_as_worker(self, fn: Callable[[T], Job | None], arg: T) -> bool:
        """From a transport callback on asyncio: run ``fn(arg)`` now as the longest waiting
        worker's task, in that task's context, as waking it would run it one step later. If
        ``fn`` returns a job, that worker wakes with it. False (nothing run) when no worker
        waits, or not on asyncio, or when called from inside a task, or without
        :mod:`smartnsq.net.eager`'s mechanisms."""
        if not self._loop:  # not waited on yet, or not asyncio
            return False
        waiting = self._waiting
        while waiting and waiting[0].done():  # cancelled waiters
            waiting.popleft()
        if not waiting:
            return False
        # Out of the queue while it runs: what ``fn`` runs (a handler awaiting the consumer's
        # stop, which wakes every idle worker) must not wake this worker with nothing, or
        # the job it is about to get is lost with the cancel scopes it entered.
        future = waiting.popleft()
        wake_alls = self._wake_alls
        try:
            job = run_as_task(future, fn, arg)
        except BaseException:
            waiting.appendleft(future)
            raise
        if job is NOT_RUN or job is None:
            if future.done():
                pass  # cancelled meanwhile
            elif self._wake_alls != wake_alls:  # it was idle then: woken too
                future.set_result(None)
                future.schedule()
            else:
                waiting.appendleft(future)
            return job is not NOT_RUN
        future.set_result(job)
        future.wake()
        return True

    def wake_all(self) -> None:
        self._wake_alls += 1
        while self._waiting:
            self.wake_one()
