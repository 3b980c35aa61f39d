"""Resuming a waiting task right where its future is resolved (asyncio only).

A plain future wakes its task through ``call_soon``: one more pass of the event loop (a poll
system call and the loop's bookkeeping) per answer, a large share of the CPU of a
one-at-a-time publisher or an ordered consumer on asyncio's pure-Python loop. Resolved in a
transport callback, outside any task, an :class:`EagerFuture` can step the waiting task
right there, as the loop would have one pass later; :func:`run_as_task` runs a function as
a waiting task (in its context), which is what that step would do.

Both lean on CPython's asyncio internals, used in this module only: the wake-up callback a
Task hands to ``Future.add_done_callback`` (with its context), and
``asyncio.tasks._enter_task``/``_leave_task``. They are used only when :func:`enabled`'s
probe, run once, finds exactly what it expects: a Python version this was tested on, those
functions, and a trial of the whole protocol on a throw-away loop. Otherwise (or with the
environment variable ``SMARTNSQ_EAGER=0``) everything takes the public path: an
:class:`EagerFuture` is a plain future woken on the loop's next pass, and
:func:`run_as_task` declines.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

TESTED = ((3, 11), (3, 12), (3, 13))

_enabled: bool | None = None  # None: not probed yet
_enter: Callable[[Any, Any], None] | None = None
_leave: Callable[[Any, Any], None] | None = None


def enabled() -> bool:
    """Whether the eager mechanisms are on (probed on the first call)."""
    if _enabled is None:
        force(None)
    return bool(_enabled)


def force(on: bool | None) -> bool:
    """Turn the eager mechanisms off (``False``), or probe again (``None``; ``True`` is
    honoured only if the probe passes). For tests and the curious; returns the new state."""
    global _enabled, _enter, _leave
    _enabled = False
    if on is False or os.environ.get("SMARTNSQ_EAGER") == "0":
        return False
    if sys.version_info[:2] not in TESTED:
        return False
    enter = getattr(asyncio.tasks, "_enter_task", None)
    leave = getattr(asyncio.tasks, "_leave_task", None)
    if not (callable(enter) and callable(leave)):
        return False
    _enter, _leave = enter, leave
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        passed = _trial()
    else:  # a trial loop cannot run inside a running one: its own thread
        result: list[bool] = []
        thread = threading.Thread(target=lambda: result.append(_trial()), name="smartnsq-probe")
        thread.start()
        thread.join()
        passed = result == [True]
    _enabled = passed
    return passed


def _trial() -> bool:
    """The protocol, end to end: the waker captured with its context, the task run as
    itself, and resumed eagerly inside a plain callback."""
    global _enabled
    var: contextvars.ContextVar[str] = contextvars.ContextVar("probe", default="")
    loop = asyncio.new_event_loop()
    _enabled = True  # for the trial's futures
    try:
        future = EagerFuture(loop=loop)
        seen: list[Any] = []
        ran: list[Any] = []

        async def waiter() -> None:
            var.set("task")
            seen.append(await future)

        def callback() -> None:  # as a transport callback: outside any task
            try:
                ran.append(run_as_task(future, lambda x: (asyncio.current_task(), var.get(), x), 1))
                future.set_result(b"ok")
                future.wake()
                ran.append(list(seen))
                ran.append(asyncio.current_task())
            finally:
                if not future.done():
                    future.set_result(b"")

        async def main() -> bool:
            task = loop.create_task(waiter())
            await asyncio.sleep(0)
            loop.call_soon(callback)
            await task
            return ran == [(task, "task", 1), [b"ok"], None]

        return loop.run_until_complete(asyncio.wait_for(main(), 1.0))
    except Exception:
        return False
    finally:
        _enabled = False
        loop.close()


class EagerFuture(asyncio.Future[Any]):
    """A future whose waiting task can be resumed by the code that resolved it.

    Once it has dealt with a whole read (a fatal error included), the resolver calls
    :meth:`wake`: from a transport callback the waiting task runs right there; inside a
    task, and for any other callback, scheduling stays the normal one. With the eager
    mechanisms off it is a plain future (:meth:`wake` and :meth:`schedule` do nothing).
    """

    _waker: tuple[Callable[[Any], object], Any] | None = None

    def add_done_callback(self, fn: Callable[[Any], object], *, context: Any = None) -> None:
        if _enabled and self._waker is None and not self.done():
            self._waker = (fn, context)  # the awaiting task's wake-up
        else:
            super().add_done_callback(fn, context=context)

    def remove_done_callback(self, fn: Callable[[Any], object]) -> int:
        if self._waker is not None and self._waker[0] == fn:
            self._waker = None
            return 1 + super().remove_done_callback(fn)
        return super().remove_done_callback(fn)

    def cancel(self, msg: Any = None) -> bool:
        if not super().cancel(msg=msg):
            return False
        self._wake(eager=False)  # as a plain future would: on the next loop pass
        return True

    def resolve(self, result: Any, error: BaseException | None) -> None:
        """Set the outcome; the waiting task runs after :meth:`wake`."""
        if self.done():  # the caller gave up (cancelled)
            return
        if error is None:
            self.set_result(result)
        else:
            self.set_exception(error)

    def wake(self) -> None:
        self._wake(eager=asyncio.current_task(self.get_loop()) is None)

    def schedule(self) -> None:
        """Wake the waiting task on the loop's next pass, as a plain future does."""
        self._wake(eager=False)

    def _wake(self, eager: bool) -> None:
        waker = self._waker
        if waker is None:
            return
        self._waker = None
        fn, context = waker
        if eager:
            if context is None:
                fn(self)
            else:
                context.run(fn, self)
        else:
            self.get_loop().call_soon(fn, self, context=context)


NOT_RUN: Any = object()  # what run_as_task returns when it ran nothing


def run_as_task(future: EagerFuture, fn: Callable[[T], R], arg: T) -> R:
    """From a transport callback: ``fn(arg)`` run as the task waiting on ``future``, in that
    task's context, as waking it would run it one step later. :data:`NOT_RUN` (nothing run)
    when the eager mechanisms are off, nothing waits in the expected way, or when called
    from inside a task."""
    waker = future._waker
    if waker is None or waker[1] is None or not _enabled:
        return NOT_RUN  # type: ignore[no-any-return]
    task = getattr(waker[0], "__self__", None)
    if not isinstance(task, asyncio.Task):
        return NOT_RUN  # type: ignore[no-any-return]
    loop = future.get_loop()
    assert _enter is not None and _leave is not None
    try:
        _enter(loop, task)
    except RuntimeError:  # inside a task: this is no transport callback
        return NOT_RUN  # type: ignore[no-any-return]
    try:
        return waker[1].run(fn, arg)  # type: ignore[no-any-return]
    finally:
        _leave(loop, task)
