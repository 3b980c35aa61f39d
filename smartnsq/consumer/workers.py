"""Workers: the tasks that run an ``async def`` handler, ``concurrency`` at a time, on the
messages intake queues (or, for an ordered partition, hands over right in the read).

Workers start lazily: one more only when messages wait and no worker is idle or already on
its way to the queue, up to ``concurrency``. A handler that finishes without suspending is
run inline, so one worker serves such a consumer at any rate; one whose handlers wait grows
to as many workers as messages wait. Started workers stay (idle ones cost a parked future),
so a burst pays the start once. Starting ``concurrency`` tasks up front cost 100 consumers
10,000 tasks (seconds of CPU and ~45 MB) before the first message."""

from __future__ import annotations

import asyncio
import inspect
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from types import CoroutineType
from typing import Any

import anyio

from smartnsq.consumer.answers import Answers
from smartnsq.consumer.message import Message, fin_owed, owed
from smartnsq.consumer.state import State
from smartnsq.net.idle import IdleWorkers
from smartnsq.net.wakeup import Wakeup

# A handling begun in the read callback that has to wait: the message, and the handler's
# coroutine with what it yielded (or None with the awaitable a plain function returned).
Job = tuple[Message, Coroutine[Any, Any, Any] | None, Any]


class Workers:
    __slots__ = (
        "adding",
        "answers",
        "calls",
        "coming",
        "ended",
        "idle",
        "limit",
        "owners",
        "pulled",
        "queue",
        "scope",
        "slots",
        "state",
        "wanted",
    )

    def __init__(self, state: State, answers: Answers) -> None:
        self.state = state
        self.answers = answers
        self.queue: deque[Message] = deque()  # for the workers, or for pulling
        self.idle = IdleWorkers()  # workers (or a puller) waiting for the queue
        # What each worker is handling right now (None when idle): for stop and auto-touch.
        self.slots: list[Message | None] = []
        self.owners: list[int] = []  # each slot's task id: a handler that stops the consumer
        self.scope: anyio.CancelScope | None = None
        self.pulled: Message | None = None  # the last message pulled with ``async for``
        self.limit = state.options.workers  # concurrency: the most workers ever started
        # Workers started or woken that have not reached the queue yet: they will take what
        # is queued now, so a queued message needs no further worker while one is coming.
        self.coming = 0
        # Set to have run() start ``adding`` more workers (None until it runs: pulling).
        self.wanted: Wakeup | None = None
        self.adding = 0
        self.calls: list[Callable[[], None]] = []  # for run() to call: see soon()
        self.ended = False

    async def pull(self) -> Message:
        """The next message for ``async for``; the one pulled before is finished (unless
        answered by hand or its auto response disabled)."""
        prev = self.pulled
        if prev is not None and owed(prev):
            self.answers.fin(prev)
        self.pulled = None
        while not self.queue:
            if self.state.stopping:
                raise StopAsyncIteration
            await self.idle.wait()
            self.coming = 0  # the one puller is the only waiter
        msg = self.pulled = self.queue.popleft()
        return msg

    def running(self) -> list[Message]:
        return [m for m in self.slots if m is not None]

    def own(self) -> Message | None:
        """The message the calling task handles, when it is a worker (a handler stopping
        the consumer: the stop must not wait for it)."""
        try:
            slot = self.owners.index(anyio.get_current_task().id)
        except ValueError:
            return None
        return self.slots[slot] if slot < len(self.slots) else None

    def cancel(self) -> None:
        """Cancel the workers (their messages are then the drain's to requeue)."""
        if self.scope is not None:
            self.scope.cancel()

    def release(self) -> None:
        """Forget what the workers held and wake whoever waits (stopping)."""
        self.slots = [None] * len(self.slots)
        self.idle.wake_all()

    def wake(self, eager: bool = False) -> None:
        """Messages were queued: wake an idle worker, else start one unless one is coming.
        ``eager``: see :meth:`IdleWorkers.wake_one`."""
        if self.idle:
            self.coming += 1  # before the wake: an eager one runs the worker right here
            self.idle.wake_one(eager)
        elif not self.coming:
            self.grow()

    def grow(self) -> None:
        """Have one more worker started (up to ``concurrency``; not before :meth:`run`, nor
        when stopping)."""
        wanted = self.wanted
        if (
            wanted is not None
            and len(self.slots) + self.adding < self.limit
            and not self.state.stopping
        ):
            self.coming += 1
            self.adding += 1
            wanted.set()

    def soon(self, fn: Callable[[], None]) -> None:
        """Have :meth:`run`'s task call ``fn`` (on the loop, from outside any task: a
        transport callback, or what another thread carried over), so that ``fn`` may start
        tasks. Once run() is over (stopping), ``fn`` is called right here."""
        if self.ended:
            fn()
            return
        self.calls.append(fn)
        if self.wanted is not None:
            self.wanted.set()

    async def run(self) -> None:
        self.slots = []
        self.owners = []
        try:
            with anyio.CancelScope() as scope:
                self.scope = scope
                async with anyio.create_task_group() as tg:
                    # Workers start here, in this task: a read arrives in a transport
                    # callback, outside any task, where a task group cannot start one (under
                    # a plain asyncio.run() the task was never run).
                    self.wanted = wanted = Wakeup()
                    if self.queue:  # queued before the start
                        self.grow()
                    while True:
                        if not self.calls:
                            await wanted.wait()
                        while self.adding:
                            self.adding -= 1
                            self.slots.append(None)
                            self.owners.append(-1)  # set by the worker as it starts
                            tg.start_soon(self._worker, len(self.slots) - 1)
                        self._call_soon_calls()
        finally:
            self.ended = True
            self._call_soon_calls()

    def _call_soon_calls(self) -> None:
        while self.calls:
            calls, self.calls = self.calls, []
            for fn in calls:
                fn()

    async def _worker(self, slot: int) -> None:
        # The async-handler hot path: no task, future or event per message. The handler's
        # coroutine is stepped here, in this worker's own task (exactly what ``await`` does);
        # a handler that finishes without suspending costs no trip through the event loop, and
        # one that suspends first lets an idle sibling take over the queue.
        state = self.state
        answers = self.answers
        backoff = answers.pacing.backoff
        queue = self.queue
        popleft = queue.popleft
        idle = self.idle
        slots = self.slots
        handler = state.options.handler
        assert handler is not None
        self.coming -= 1  # started: at the queue now
        self.owners[slot] = anyio.get_current_task().id
        while not state.stopping:
            if not queue:
                job = await idle.wait()
                if job is not None:
                    await self._take_over(slot, job)  # handed a job: it was not coming
                else:
                    self.coming -= 1
                continue
            msg = popleft()
            slots[slot] = msg
            try:
                coro = handler(msg)
                if type(coro) is CoroutineType:
                    try:
                        step = coro.send(None)
                    except StopIteration as stop:
                        value = stop.value
                    else:
                        if queue:  # this one waits: the queue needs another worker
                            self.wake()
                        value = await _Resume(coro, step)
                else:
                    value = coro
                while value is not None and inspect.isawaitable(value):
                    value = await value  # returned, rather than awaited, by the handler
            except Exception as exc:
                answers.handler_failed(msg, exc)
            else:
                if value is False:
                    if owed(msg):
                        answers.req(msg, None, True)
                else:
                    # Answers.fin for the usual outcome, in one call: once per message
                    sent = fin_owed(msg)
                    if sent:
                        answers.finished += 1
                    if sent is not None and backoff.level:
                        answers.pacing.result(success=True)
            slots[slot] = None

    def handle_now(self, msg: Message) -> Job | None:
        """A worker's handling of ``msg``, run as that worker by ``IdleWorkers.run_as_worker``
        in the read callback; a handler that has to wait is returned, for the worker."""
        try:
            coro = self.state.options.handler(msg)  # type: ignore[misc]  # set where this runs
            if type(coro) is CoroutineType:
                try:
                    step = coro.send(None)
                except StopIteration as stop:
                    value = stop.value
                else:
                    return msg, coro, step
            else:
                value = coro
            if value is not None and inspect.isawaitable(value):
                return msg, None, value
        except Exception as exc:
            self.answers.handler_failed(msg, exc)
        except anyio.get_cancelled_exc_class():
            # Raised to the worker, as if it had run the handler (not into the event loop).
            cancelled = asyncio.get_running_loop().create_future()
            cancelled.cancel()
            return msg, None, cancelled
        else:
            self.answers.answer(msg, value)
        return None

    async def _take_over(self, slot: int, job: Job) -> None:
        """Finish a handling that ``handle_now`` began and that had to wait."""
        msg, coro, value = job
        self.slots[slot] = msg
        try:
            value = await (value if coro is None else _Resume(coro, value))
            while value is not None and inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            self.answers.handler_failed(msg, exc)
        else:
            self.answers.answer(msg, value)
        self.slots[slot] = None


class _Resume:
    """Awaitable that continues a coroutine whose first step already ran (and yielded
    ``step``): it hands each yielded value to the running task and forwards what the task
    sends or throws back, as ``await coro`` would have."""

    __slots__ = ("coro", "step")

    def __init__(self, coro: Coroutine[Any, Any, Any], step: Any) -> None:
        self.coro = coro
        self.step = step

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, value = self.coro, self.step
        while True:
            try:
                sent = yield value
            except BaseException as exc:  # cancellation, GeneratorExit on close()
                try:
                    value = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    value = coro.send(sent)
                except StopIteration as stop:
                    return stop.value
