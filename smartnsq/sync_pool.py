"""Worker threads for plain (``def``) handlers, so the event loop keeps answering heartbeats.

Messages go in by the batch (one :meth:`SyncPool.submit` per read) and outcomes come back
through an :class:`~smartnsq.inbox.Inbox`, which wakes the loop once per batch of outcomes.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from smartnsq.inbox import Inbox

# What a worker puts in the inbox: the item itself when the handler returned None (the
# common case, no tuple built), else one of these.
RETURNED = 0  # (RETURNED, item, value): the handler returned something other than None
FAILED = 1  # (FAILED, item, exception)

BATCH = 256  # outcomes after which a busy thread wakes the loop even with work queued


class SyncPool:
    """Up to ``size`` threads calling ``handler`` on submitted items, oldest first.

    One thread takes the work while it keeps up: more threads on a fast handler only fight
    over the GIL. Threads are added (started as needed) when :meth:`check`, called
    periodically on the loop, finds work waiting and no thread finished an item since the
    previous call: the number running doubles each time, so slow handlers soon spread over
    all of them.
    """

    def __init__(self, handler: Callable[[Any], Any], size: int, inbox: Inbox) -> None:
        self._handler = handler
        self._size = size
        self._inbox = inbox
        self._queue: deque[Any] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._idle = 0  # threads waiting for work
        self._waking = 0  # threads notified or started that have not taken work yet
        self.active = 0  # threads not waiting for work: running a handler or about to
        self.slots: list[Any] = []  # what each thread is running now (None: nothing)
        self._seen: list[Any] = []  # slots as the last check() saw them
        self.closed = False

    @property
    def backlog(self) -> int:
        """Items no thread has started yet."""
        return len(self._queue)

    def submit(self, items: list[Any]) -> None:
        """Queue ``items`` for the threads (on the loop)."""
        self._queue.extend(items)
        with self._cond:
            # A thread running or on its way gets to them (check() adds one if it is stuck).
            if not self.active and not self._waking:
                self._wake()

    def check(self) -> None:
        """Add threads when work waits and none made progress since the last call (on the
        loop)."""
        seen, slots = self._seen, self.slots[:]
        self._seen = slots
        if not self._queue or self._waking or len(seen) != len(slots):
            return  # nothing waits, or a thread is on its way
        if sum(item is not None for item in slots) < self.active:
            return  # some running thread is between items: it takes the next one
        if any(a is not b for a, b in zip(seen, slots, strict=True)):
            return  # progress
        with self._cond:
            for _ in range(max(1, self.active)):
                self._wake()

    def take_unstarted(self) -> list[Any]:
        """Remove and return the items no thread has started."""
        out = []
        popleft = self._queue.popleft
        while True:
            try:
                out.append(popleft())
            except IndexError:
                return out

    def running(self) -> list[Any]:
        """What the threads are running, or ran last and have not gone idle since."""
        return [item for item in self.slots if item is not None]

    def close(self) -> None:
        """Threads exit once their current handler returns; nothing new is started."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def _wake(self) -> None:  # with the lock held
        if self._idle > self._waking:
            self._waking += 1
            self._cond.notify()
        elif len(self.slots) < self._size and not self.closed:
            self._waking += 1
            self.active += 1
            index = len(self.slots)
            self.slots.append(None)
            threading.Thread(
                target=self._work, args=(index,), name=f"smartnsq-handler-{index}", daemon=True
            ).start()

    def _work(self, index: int) -> None:
        queue = self._queue
        popleft = queue.popleft
        slots = self.slots
        handler = self._handler
        inbox = self._inbox
        append = inbox.append
        wake = inbox.wake
        cond = self._cond
        with cond:
            self._waking -= 1
        unsent = 0
        while True:
            # The hot loop: no lock, and the loop is woken once the queue is empty (or
            # every BATCH outcomes): waking it sooner hands it the GIL mid-batch for a few
            # FINs at a time. Outcomes of slow handlers behind a backlog are picked up by
            # the loop's periodic check.
            while True:
                try:
                    item = popleft()
                except IndexError:
                    break
                slots[index] = item  # stays after the outcome is sent: check has_responded
                try:
                    result = handler(item)
                except BaseException as exc:  # any failure is the item's failure
                    append((FAILED, item, exc))
                else:
                    append(item if result is None else (RETURNED, item, result))
                unsent += 1
                if (not queue or unsent >= BATCH) and not inbox.scheduled:
                    unsent = 0
                    wake()
            with cond:
                if queue and not self.closed:
                    continue
                slots[index] = None
                self.active -= 1
                if self.closed:
                    return
                self._idle += 1
                cond.wait()
                self._idle -= 1
                self.active += 1
                if self._waking:
                    self._waking -= 1
