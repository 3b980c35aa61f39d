"""Drain: the graceful stop (nothing left in flight), and auto-touch of running handlings."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import cast

import anyio

from smartnsq.consumer.answers import Answers
from smartnsq.consumer.intake import Intake
from smartnsq.consumer.message import Message, delivered_at, owed, sub_of, times
from smartnsq.consumer.nodes import Nodes
from smartnsq.consumer.state import State
from smartnsq.consumer.subscription import Subscription
from smartnsq.consumer.threads import Threads
from smartnsq.consumer.workers import Workers
from smartnsq.errors import NSQError
from smartnsq.protocol import commands

log = logging.getLogger("smartnsq.consumer")


class Drain:
    __slots__ = ("answers", "draining", "intake", "nodes", "state", "stopped", "threads", "workers")

    def __init__(
        self,
        state: State,
        answers: Answers,
        workers: Workers,
        threads: Threads,
        intake: Intake,
        nodes: Nodes,
    ) -> None:
        self.state = state
        self.answers = answers
        self.workers = workers
        self.threads = threads
        self.intake = intake
        self.nodes = nodes
        self.stopped = anyio.Event()
        self.draining: anyio.CancelScope | None = None  # the wait for running handlers

    def running(self, threads: bool = True, with_held: bool = True) -> list[Message]:
        """The messages whose handling is under way (``with_held``: also dead-letter copies
        not started yet, and ordered messages held between two failed copies)."""
        running = self.workers.running()
        pool = self.threads.pool
        if threads and pool is not None:
            running += pool.running()
        if self.answers.awaiting:
            running += self.answers.awaiting
        dead = self.answers.dead
        if dead is not None and dead.pending:  # copies to the dead-letter topic under way
            running += dead.pending if with_held else dead.copying()
        return running

    def _held(self) -> bool:
        """A message sink still holds unanswered messages (its owner answers them)."""
        return self.intake.sink is not None and any(
            s.in_flight > 0 and s.conn.usable for s in self.state.subs.values()
        )

    async def stop(self, timeout: float, pulled_done: bool) -> None:
        """See :meth:`smartnsq.Consumer.stop`; the message last pulled with ``async for`` is
        finished when ``pulled_done``, else requeued."""
        state, answers = self.state, self.answers
        if state.stopping:
            await self.stopped.wait()
            return
        state.stopping = True
        answers.pacing.pause()
        queue = self.workers.queue
        while queue:  # never started: give them back right away
            answers.give_back(queue.popleft())
        pool = self.threads.pool
        if pool is not None:
            for (sub, src, _), item in pool.take_unstarted():
                answers.give_back(item if src is None else delivered_at(sub, src, item))
            pool.close()  # running handlers finish; nothing new starts
        pulled = self.workers.pulled
        if pulled is not None and owed(pulled):
            if pulled_done:
                answers.fin(pulled)
            else:
                answers.give_back(pulled)
        started = anyio.current_time()
        mine = self.workers.own()  # a handler stopping its consumer: never waited for
        with anyio.move_on_after(timeout) as self.draining:
            while (
                [m for m in self.running(with_held=False) if m is not mine]
                or self.threads.busy()
                or self._held()
            ):
                await anyio.sleep(0.01)
        self.draining = None
        self.workers.cancel()
        if self.threads.inbox is not None:
            self.threads.inbox.drain()  # outcomes already back: answered as the handler said
        # Threads cannot be cancelled: take their messages over (a thread answers only
        # what it still owns) and requeue them.
        running = self.running(threads=False)
        if pool is not None:
            running += pool.steal_running()
        dead = self.answers.dead
        copying = dead.copying() if dead is not None else []
        if dead is not None and copying:
            log.warning(
                "stop: %d copies to dead-letter topic %s still unacknowledged after %.1f s; "
                "their messages are requeued (one may be copied twice)",
                len(copying),
                dead.letters.topic,
                anyio.current_time() - started,  # a second stop may have cut the wait
            )
        for msg in running:
            if not msg.has_responded:
                answers.give_back(msg)
        self.workers.release()
        with anyio.CancelScope(shield=True):
            subs = list(state.subs.values())
            async with anyio.create_task_group() as tg:
                for sub in subs:
                    tg.start_soon(_close_wait, sub)
            for sub in subs:
                await sub.conn.close(timeout=1.0)
        self.nodes.cancel()
        self.stopped.set()

    def cut(self, timeout: float) -> None:
        """A second stop: cut the wait for running handlers down to ``timeout``."""
        draining = self.draining
        if draining is not None:
            draining.deadline = min(draining.deadline, anyio.current_time() + timeout)

    async def touch_loop(self) -> None:
        """``auto_touch``: TOUCH running handlings' messages at half nsqd's timeout (with
        ``None``, those of ordered partitions only), looking at least four times per
        timeout."""
        every = self.state.options.auto_touch is True
        while True:
            timeouts = [s.conn.features.msg_timeout for s in self.state.subs.values()]
            await anyio.sleep(min([1.0, *(t / 4 for t in timeouts if t > 0)]))
            now = time.monotonic()
            running = self.running()
            for sub in self.state.subs.values():
                # An ordered message waiting its turn or held by a sink's thread (or pulled
                # with ``async for``): its partition waits for it too.
                held = sub.held
                if held is not None and not held.has_responded:
                    running.append(held)
            for msg in running:
                sub = cast(Subscription, sub_of(msg))
                if not (every or sub.ordered):
                    continue
                features = sub.conn.features
                received, touched = times(msg)
                if msg.has_responded or now - received >= features.max_msg_timeout:
                    continue
                if now - touched >= features.msg_timeout / 2:
                    with contextlib.suppress(NSQError):  # a handler thread just answered it
                        self.answers.touch_now(msg)


# How long a connection is still read after CLOSE_WAIT. A message nsqd's sender took just
# before RDY 0 reached it follows the CLOSE_WAIT as soon as the sender loops: both nsqds
# flush at once for a client that is not ready. On loopback that took 0-2 ms, 13 ms at worst
# with the CPUs oversubscribed; nsqd's output buffer timeout plays no part.
STRAGGLER_WAIT = 0.05


async def _close_wait(sub: Subscription) -> None:
    """CLS, then keep reading for STRAGGLER_WAIT: a message nsqd sends after CLOSE_WAIT is
    requeued as it comes (see intake); closed without reading, it would stay in flight in
    nsqd until its timeout."""
    conn = sub.conn
    if not conn.usable:
        return
    with anyio.move_on_after(2.0), contextlib.suppress(NSQError):
        await conn.request(commands.CLS, timeout=1.0)
        await anyio.sleep(STRAGGLER_WAIT)
