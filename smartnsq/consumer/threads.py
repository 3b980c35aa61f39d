"""Handler threads: plain (``def``) handlers run in worker threads, so the event loop keeps
answering heartbeats; :class:`Threads` bridges their outcomes back to the loop.

The loop hands over each read as one job: the subscription, the read buffer and the
message frames' spans (or, off the hot path, messages it already decoded). A thread builds
each message right before calling the handler, so a message lives only as long as its
handler runs (no pile of queued objects for the garbage collector to walk), and for the
usual outcome, FIN, it only appends the message id to its own deque: the loop writes one
FIN command per batch without touching the messages again. Other outcomes go through the
:class:`~smartnsq.net.inbox.Inbox`, which also wakes the loop, once per batch.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from functools import partial
from operator import itemgetter
from typing import Any

import anyio

from smartnsq.consumer.answers import Answers
from smartnsq.consumer.message import Message, claim_fin, delivered_at
from smartnsq.consumer.state import State
from smartnsq.consumer.subscription import Subscription
from smartnsq.errors import NSQError
from smartnsq.net.inbox import Inbox, Kind

log = logging.getLogger("smartnsq.consumer")

BATCH = 256  # outcomes after which a busy thread wakes the loop even with work queued

# A job: (subscription, read buffer, where each message frame's data starts in it) or
# (subscription, None, messages); threads pop from the deque. Plain ints, unlike span tuples,
# are no work for the garbage collector while they wait.
Job = tuple[Subscription, bytes | None, deque[Any]]
_start = itemgetter(1)


class SyncPool:
    """Up to ``size`` threads calling ``handler`` on the messages of submitted jobs.

    One thread takes the work while it keeps up: more threads on a fast handler only fight
    over the GIL. :meth:`check`, called periodically on the loop, adds threads when work
    waits and no thread finished a message since the previous call (the number running
    doubles each time, so slow handlers soon spread over all of them); a thread added that
    way helps with the jobs the stuck ones hold.
    """

    def __init__(
        self, handler: Callable[[Message], Any], size: int, inbox: Inbox, max_attempts: int
    ) -> None:
        self._handler = handler
        self._size = size
        self._inbox = inbox
        self._max_attempts = max_attempts
        self._queue: deque[Job] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._idle = 0  # threads waiting for work
        self._waking = 0  # threads notified or started that have not taken work yet
        self.active = 0  # threads not waiting for work
        self.jobs: list[Job | None] = []  # the job each thread works on
        self.owned: dict[int, Message] = {}  # thread index -> message its handler runs
        # Per thread: a Subscription, then the ids of the messages of that subscription to FIN.
        self.fins: list[deque[Any]] = []
        self._seen: list[Message | None] = []
        self.closed = False

    @property
    def backlog(self) -> int:
        """Messages no thread has started yet."""
        return sum(len(job[2]) for job in self._all_jobs())

    def submit(self, sub: Subscription, src: bytes | None, items: list[Any]) -> None:
        """Queue one read's frame spans (with ``src``) or messages (``src=None``) (on the
        loop)."""
        self._queue.append((sub, src, deque(items if src is None else map(_start, items))))
        with self._cond:
            # A thread running or on its way gets to them (check() adds one if it is stuck).
            if not self.active and not self._waking:
                self._wake()

    def take_unstarted(self) -> list[tuple[Job, Any]]:
        """Remove and return what no thread has started, each with its job."""
        out = []
        for job in self._all_jobs():
            popleft = job[2].popleft
            while True:
                try:
                    out.append((job, popleft()))
                except IndexError:
                    break
        return out

    def steal_running(self) -> list[Message]:
        """Take the messages whose handler is running: their outcome will be ignored."""
        taken = []
        for index in list(self.owned):
            msg = self.owned.pop(index, None)
            if msg is not None:
                taken.append(msg)
        return taken

    def running(self) -> list[Message]:
        return list(self.owned.values())

    def close(self) -> None:
        """Threads exit once their current handler returns; nothing new is started."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def check(self) -> None:
        """Add threads when work waits and none made progress since the last call (on the
        loop)."""
        seen = self._seen
        now = [self.owned.get(index) for index in range(len(self.jobs))]
        self._seen = now
        if self._waking or len(seen) != len(now) or not self.backlog:
            return  # a thread is on its way, or nothing waits
        if sum(msg is not None for msg in now) < self.active:
            return  # some running thread is between messages: it takes the next one
        if any(a is not b for a, b in zip(seen, now, strict=True)):
            return  # progress
        with self._cond:
            for _ in range(max(1, self.active)):
                self._wake()

    def _all_jobs(self) -> list[Job]:
        jobs = list(self._queue)
        queued = {id(job) for job in jobs}
        for job in self.jobs:  # several threads may share one
            if job is not None and id(job) not in queued:
                queued.add(id(job))
                jobs.append(job)
        return jobs

    def _wake(self) -> None:  # with the lock held
        if self._idle > self._waking:
            self._waking += 1
            self._cond.notify()
        elif len(self.jobs) < self._size and not self.closed:
            self._waking += 1
            self.active += 1
            index = len(self.jobs)
            self.jobs.append(None)
            self.fins.append(deque())
            threading.Thread(
                target=self._work, args=(index,), name=f"smartnsq-handler-{index}", daemon=True
            ).start()

    def _next_job(self, index: int) -> Job | None:
        try:
            return self._queue.popleft()
        except IndexError:
            pass
        for job in self.jobs:  # help a thread stuck in a slow handler with the rest
            if job is not None and job[2]:
                return job
        return None

    def _work(self, index: int) -> None:
        handler = self._handler
        inbox = self._inbox
        append = inbox.append
        wake = inbox.wake
        cond = self._cond
        owned = self.owned
        fins = self.fins[index]
        fin = fins.append
        max_attempts = self._max_attempts
        queue = self._queue
        returned, failed, give_up = Kind.RETURNED, Kind.FAILED, Kind.GIVE_UP
        with cond:
            self._waking -= 1
        unsent = 0
        while True:
            job = self._next_job(index)
            if job is None:
                with cond:
                    if self._queue and not self.closed:
                        continue
                    self.jobs[index] = None
                    self.active -= 1
                    if self.closed:
                        return
                    self._idle += 1
                    cond.wait()
                    self._idle -= 1
                    self.active += 1
                    if self._waking:
                        self._waking -= 1
                continue
            self.jobs[index] = job
            sub, src, items = job
            fin(sub)
            popleft = items.popleft
            # The hot loop: no lock; the loop is woken once the work runs out (or every
            # BATCH outcomes): waking it sooner hands it the GIL mid-batch for a few FINs.
            while True:
                try:
                    x = popleft()
                except IndexError:
                    break
                if src is not None:  # where a frame's data starts: make the message now
                    msg = delivered_at(sub, src, x)
                    if max_attempts and msg.attempts > max_attempts:
                        append((give_up, msg, None))
                        continue
                else:
                    msg = x
                owned[index] = msg
                try:
                    result = handler(msg)
                except BaseException as exc:  # any failure is the message's failure
                    owned.pop(index, None)
                    append((failed, msg, exc))
                else:
                    mine = owned.pop(index, None) is msg  # else stop() took it over
                    if result is not None:
                        append((returned, msg, result))
                    elif mine and claim_fin(msg):
                        fin(msg.id)
                unsent += 1
                if (unsent >= BATCH or not (items or queue)) and not inbox.scheduled:
                    unsent = 0
                    wake()
            if not inbox.scheduled and (fins or len(inbox)):
                unsent = 0
                wake()


class Threads:
    """The bridge between the loop and the handler threads: starts the pool (with a ``def``
    handler), and on the loop writes what the threads send back: batched FINs, other
    outcomes, and answers made by hand on a thread."""

    __slots__ = ("answers", "fin_subs", "inbox", "pool", "state")

    def __init__(self, state: State, answers: Answers) -> None:
        self.state = state
        self.answers = answers
        self.pool: SyncPool | None = None
        self.inbox: Inbox | None = None
        self.fin_subs: dict[int, Subscription] = {}  # thread index -> where its FINs go

    def start(self, kick: Callable[[Callable[[], None]], None] | None = None) -> None:
        """On the loop: the inbox, and the pool for a plain ``def`` handler. ``kick``: a task
        the inbox can have its handling run in (see :class:`~smartnsq.net.inbox.Inbox`), else it
        gets one of its own."""
        state = self.state
        options = state.options
        quick = partial(self._send_fins, False)
        self.inbox = inbox = self.answers.inbox = Inbox(self._on_inbox, quick, kick)
        state.defer = lambda fn: inbox.put((Kind.CALL, fn, ()))
        if kick is None:
            state.spawn(self.inbox.run)
        if options.handler is not None and not options.async_handler:
            self.pool = SyncPool(options.handler, options.workers, self.inbox, options.max_attempts)
            state.spawn(self._watch, self.pool)

    async def _watch(self, pool: SyncPool) -> None:
        """Add threads when handlers are stuck; collect outcomes threads have not sent."""
        inbox = self.inbox
        assert inbox is not None
        while not pool.closed:
            await anyio.sleep(0.01 if pool.backlog else 0.05)
            pool.check()
            inbox.drain()

    def busy(self) -> bool:
        """Some handler thread is running, or its outcome has not been dealt with yet."""
        pool = self.pool
        if pool is not None and (pool.active or any(pool.fins)):
            return True
        return self.inbox is not None and len(self.inbox) > 0

    def _on_inbox(self, items: deque[Any]) -> None:
        """On the loop: what handler threads sent back since the last call, in order
        (calls from a thread before the FINs they may precede)."""
        answers = self.answers
        popleft = items.popleft
        returned, failed, give_up = Kind.RETURNED, Kind.FAILED, Kind.GIVE_UP
        while items:
            kind, target, value = popleft()
            if kind == returned:
                answers.handler_returned(target, value)
            elif kind == failed:
                answers.handler_failed(target, value)
            elif kind == give_up:
                answers.give_up(target)
            else:  # finish(), requeue() or touch() from a thread
                assert kind == Kind.CALL
                try:
                    target(*value)
                except NSQError as exc:  # say, answered twice; the thread cannot be told
                    log.warning("%s", exc)
        self._send_fins(True)

    def _send_fins(self, in_task: bool) -> bool:
        """Write the FINs handler threads queued; False when that needs a task (the backoff
        bookkeeping may start one)."""
        if self.answers.pacing.backoff.level and not in_task:
            return False
        pool = self.pool
        if pool is not None:
            for index, fins in enumerate(pool.fins):
                if fins:
                    self._send(index, fins)
        return True

    def _send(self, index: int, fins: deque[Any]) -> None:
        """One FIN command per run of ids a thread queued for one subscription."""
        sub = self.fin_subs.get(index)
        ids: list[bytes] = []
        popleft = fins.popleft
        while True:
            try:
                item = popleft()
            except IndexError:
                break
            if type(item) is bytes:
                ids.append(item)
                continue
            if ids and sub is not None:
                self.answers.finish_ids(sub, ids)
                ids = []
            sub = self.fin_subs[index] = item
        if ids and sub is not None:
            self.answers.finish_ids(sub, ids)
