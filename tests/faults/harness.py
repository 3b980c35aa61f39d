"""Workload, faults and bookkeeping of the fault-injection tests.

Eight publishing tasks (async) or threads (blocking) publish while one consumer (async or
sync handler) records what it handled, and where from. What is published and how it is
booked is a :class:`Workload`: numbered bodies (:class:`Record`, classic) or keyed ones
(``tests.faults.keyed.Book``, Youzan). The test drives the faults from its own thread
(Toxiproxy's API is blocking) and checks the invariants on the workload.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
from anyio.from_thread import BlockingPortal, start_blocking_portal

import smartnsq
import smartnsq.sync
from compat.toxiproxy import Proxy
from smartnsq import ConnectionConfig, ConsumerStats, Message, ProducerStats
from smartnsq.errors import NSQError

PUBLISHERS = 8
SLACK = 3.0  # scheduling on a loaded 2-core machine: added to every derived bound
ERROR_PAUSE = 0.05  # a publisher's pause after a failed publish (failures can be instant)


def _silence(p: Proxy) -> None:
    p.silence()


def _reset(p: Proxy) -> None:
    p.reset_peer()


def _refuse(p: Proxy) -> None:
    p.refuse()


def _latency(p: Proxy) -> None:
    p.latency(300, 100, streams=("downstream",))


def _slicer(p: Proxy) -> None:
    p.slicer(average=4, variation=3)


def _bandwidth(p: Proxy) -> None:
    p.bandwidth(4)  # KB/s each way: far below what the publishers send


# fault -> (inject, seconds held on classic, whether the node is cut off while it lasts)
FAULTS: dict[str, tuple[Callable[[Proxy], None], float, bool]] = {
    "silent": (_silence, 4.0, True),  # longer than 2 heartbeat intervals + 10 %
    "reset": (_reset, 3.0, True),
    "refused": (_refuse, 3.0, True),
    "latency": (_latency, 3.0, False),  # 300 ms +- 100 ms server -> client
    "slicer": (_slicer, 3.0, False),  # 1-7 byte pieces both ways
    "bandwidth": (_bandwidth, 3.0, False),
}


@dataclass(frozen=True)
class Settings:
    """The clients' settings, and the recovery bounds that follow from them."""

    heartbeat_interval: float = 1.0
    reconnect_min: float = 0.2
    reconnect_max: float = 1.0
    lookupd_poll_interval: float = 1.0
    lookupd_poll_jitter: float = 0.3
    publish_timeout: float = 2.0
    max_retries: int = 2
    max_in_flight: int = 50
    msg_timeout: float = 3.0  # messages in flight on a lost connection come back after it

    @property
    def stale_after(self) -> float:
        """A connection silent this long is closed (two heartbeat intervals + 10 %)."""
        return max(0.5, 2.2 * self.heartbeat_interval)

    @property
    def handshake_timeout(self) -> float:
        return ConnectionConfig().handshake_timeout

    def producer_bound(self, fault: float) -> float:
        """Seconds after a heal within which the producer uses the node again.

        A failed nsqd is avoided for 0.2 s, doubling with each failed probe up to 30 s: at
        the heal the wait in force is at most twice the time spent failing plus the first
        one. Then a probe stuck on the old link ends within a publish timeout, and a
        connection that lived through a silence is given up after ``stale_after``."""
        avoided = min(30.0, 2 * (fault + self.publish_timeout) + 0.2)
        return avoided + self.publish_timeout + self.stale_after + SLACK

    @property
    def stall_after(self) -> float:
        """A node whose oldest publish has waited this long is passed over: the Producer's
        rule, a tenth of its timeout, at most 0.5 s."""
        return min(0.5, self.publish_timeout / 10)

    def publish_stall_bound(self) -> float:
        """Longest time in which no publish may be acknowledged while one nsqd is faulty.

        A publisher whose publish went to the faulty nsqd waits until it is given up (a
        publish timed out, or ``stale_after`` of silence); the others go to the nsqd with the
        fewest publishes awaiting an answer and, once the faulty one's oldest has waited
        ``stall_after``, not to it at all: the healthy nsqd keeps acknowledging. Plus 0.8 s
        for scheduling on a loaded machine; far under ``min(publish_timeout, stale_after)``,
        for which every publisher used to stall."""
        return self.stall_after + 0.8

    def consumer_bound(self) -> float:
        """Seconds after a heal within which the consumer is subscribed to the node again:
        its old connection given up (``stale_after``), a handshake started during the fault
        timed out, one reconnect delay (at most ``reconnect_max``), and a lookupd query."""
        poll = self.lookupd_poll_interval * (1 + self.lookupd_poll_jitter)
        return self.stale_after + self.handshake_timeout + self.reconnect_max + poll + SLACK

    def drain_bound(self) -> float:
        """Seconds after publishing stopped within which every acknowledged message is
        handled: in flight on a lost connection, nsqd hands it out again after
        ``msg_timeout`` (checked about every 100 ms), over a connection that may still be
        reconnecting."""
        return self.msg_timeout + self.consumer_bound() + SLACK

    def producer_kwargs(self) -> dict[str, Any]:
        return {
            "timeout": self.publish_timeout,
            "max_retries": self.max_retries,
            "heartbeat_interval": self.heartbeat_interval,
            "lookupd_poll_interval": self.lookupd_poll_interval,
        }

    def consumer_kwargs(self) -> dict[str, Any]:
        return {
            "max_in_flight": self.max_in_flight,
            "msg_timeout": self.msg_timeout,
            "heartbeat_interval": self.heartbeat_interval,
            "reconnect_min": self.reconnect_min,
            "reconnect_max": self.reconnect_max,
            "lookupd_poll_interval": self.lookupd_poll_interval,
            "lookupd_poll_jitter": self.lookupd_poll_jitter,
        }


@dataclass
class Record:
    """What was acknowledged, raised and handled; thread-safe."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    acked: dict[bytes, float] = field(default_factory=dict)  # body -> when acknowledged
    errors: list[BaseException] = field(default_factory=list)
    handled: Counter[bytes] = field(default_factory=Counter)
    arrivals: list[tuple[float, str, bytes]] = field(default_factory=list)  # (when, nsqd, body)
    numbers: Counter[int] = field(default_factory=Counter)  # publisher -> next number

    def next_publish(self, task: int) -> tuple[bytes, dict[str, Any]]:
        """A fresh numbered body each time (a failed one is not published again)."""
        i = self.numbers[task]
        self.numbers[task] += 1
        return b"%d:%d" % (task, i), {}

    def ack(self, body: bytes) -> None:
        with self.lock:
            self.acked[body] = time.monotonic()

    def error(self, exc: BaseException) -> None:
        with self.lock:
            self.errors.append(exc)

    def handle(self, message: Message) -> None:
        with self.lock:
            self.handled[message.body] += 1
            self.arrivals.append((time.monotonic(), message.nsqd_address, message.body))

    # ---- questions

    def describe_missing(self) -> str:
        gone = sorted(self.missing())
        return f"{len(gone)} acknowledged not handled, e.g. {gone[:5]}; {self.summary()}"

    def missing(self) -> set[bytes]:
        with self.lock:
            return {b for b in self.acked if b not in self.handled}

    def duplicates(self) -> int:
        with self.lock:
            return sum(n - 1 for n in self.handled.values() if n > 1)

    def foreign_errors(self) -> list[BaseException]:
        with self.lock:
            return [e for e in self.errors if not isinstance(e, NSQError)]

    def acked_between(self, t0: float, t1: float) -> int:
        with self.lock:
            return sum(1 for t in self.acked.values() if t0 <= t < t1)

    def longest_gap(self, t0: float, t1: float) -> float:
        """The longest time within ``[t0, t1]`` in which no publish was acknowledged."""
        with self.lock:
            times = sorted(t for t in self.acked.values() if t0 <= t <= t1)
        edges = [t0, *times, t1]
        return max(b - a for a, b in itertools.pairwise(edges))

    def handled_between(self, t0: float, t1: float, nsqd: str | None = None) -> int:
        with self.lock:
            return sum(
                1 for t, a, _ in self.arrivals if t0 <= t < t1 and (nsqd is None or a == nsqd)
            )

    def first_fresh_from(self, nsqd: str, since: float) -> float | None:
        """When the first message acknowledged after ``since`` arrived from ``nsqd``."""
        with self.lock:
            for t, a, body in self.arrivals:
                if a == nsqd and self.acked.get(body, -math.inf) >= since:
                    return t
        return None

    def summary(self) -> str:
        with self.lock:
            kinds = Counter(type(e).__name__ for e in self.errors)
            return (
                f"acked={len(self.acked)} handled={sum(self.handled.values())} "
                f"distinct={len(self.handled)} errors={dict(kinds)}"
            )


class Workload(Protocol):
    """What the publishers publish, and the book of what was acknowledged and handled."""

    def next_publish(self, task: int) -> tuple[bytes, dict[str, Any]]:
        """Publisher ``task``'s next body and the ``publish`` keywords that go with it."""
        ...

    def ack(self, body: bytes) -> None: ...
    def error(self, exc: BaseException) -> None: ...
    def handle(self, message: Message) -> None: ...


class Clients(Protocol):
    """Publishers and a consumer, running in the background."""

    def start(self) -> None: ...
    def stop_publishing(self) -> None: ...
    def producer_stats(self) -> ProducerStats: ...
    def consumer_stats(self) -> ConsumerStats: ...
    def close(self) -> None: ...


@dataclass
class Target:
    topic: str
    channel: str
    nsqd_tcp: Sequence[str] = ()  # producer's addresses
    producer_lookupd: Sequence[str] = ()
    consumer_lookupd: Sequence[str] = ()
    consumer_nsqd: Sequence[str] = ()


def _addresses(target: Target, producer: bool) -> dict[str, Any]:
    if producer:
        out: dict[str, Any] = {}
        if target.nsqd_tcp:
            out["nsqd_tcp_addresses"] = list(target.nsqd_tcp)
        if target.producer_lookupd:
            out["lookupd_http_addresses"] = list(target.producer_lookupd)
        return out
    out = {}
    if target.consumer_nsqd:
        out["nsqd_tcp_addresses"] = list(target.consumer_nsqd)
    if target.consumer_lookupd:
        out["lookupd_http_addresses"] = list(target.consumer_lookupd)
    return out


class AsyncClients:
    """``smartnsq.Producer`` shared by 8 tasks and a ``smartnsq.Consumer`` with an async
    handler, on an event loop in a background thread."""

    def __init__(self, target: Target, settings: Settings, record: Workload, pace: float) -> None:
        self.target, self.settings, self.record, self.pace = target, settings, record, pace
        self._publishing = threading.Event()
        self._portal_cm: Any = None
        self._portal: BlockingPortal | None = None
        self._main: Any = None
        self._producer: smartnsq.Producer | None = None
        self._consumer: smartnsq.Consumer | None = None
        self._done: anyio.Event | None = None
        self._ready = threading.Event()
        self._published = threading.Event()

    def start(self) -> None:
        self._publishing.set()
        self._portal_cm = start_blocking_portal()
        self._portal = self._portal_cm.__enter__()
        self._main = self._portal.start_task_soon(self._run)
        if not self._ready.wait(30):
            raise AssertionError("the async clients did not start")

    async def _run(self) -> None:
        self._done = anyio.Event()
        record, s = self.record, self.settings

        async def handle(message: Message) -> None:
            record.handle(message)

        async def publisher(producer: smartnsq.Producer, task: int) -> None:
            while self._publishing.is_set():
                body, kwargs = record.next_publish(task)
                try:
                    await producer.publish(self.target.topic, body, **kwargs)
                except Exception as exc:  # every one must be an NSQError: checked by the test
                    record.error(exc)
                    await anyio.sleep(ERROR_PAUSE)
                else:
                    record.ack(body)
                await anyio.sleep(self.pace)

        async with (
            smartnsq.Producer(**_addresses(self.target, True), **s.producer_kwargs()) as producer,
            smartnsq.Consumer(
                self.target.topic,
                self.target.channel,
                handle,
                **_addresses(self.target, False),
                **s.consumer_kwargs(),
            ) as consumer,
        ):
            self._producer, self._consumer = producer, consumer
            self._ready.set()
            async with anyio.create_task_group() as tg:
                for task in range(PUBLISHERS):
                    tg.start_soon(publisher, producer, task)
            self._published.set()
            await self._done.wait()

    def stop_publishing(self) -> None:
        self._publishing.clear()
        assert self._published.wait(60), "a publishing task is stuck"

    def producer_stats(self) -> ProducerStats:
        assert self._portal is not None and self._producer is not None
        return self._portal.call(self._producer.stats)

    def consumer_stats(self) -> ConsumerStats:
        assert self._portal is not None and self._consumer is not None
        return self._portal.call(self._consumer.stats)

    def close(self) -> None:
        if self._portal is None:
            return
        self._publishing.clear()
        if self._done is not None:
            self._portal.call(self._done.set)
        try:
            self._main.result(timeout=60)
        finally:
            self._portal_cm.__exit__(None, None, None)
            self._portal = None


class SyncClients:
    """``smartnsq.sync.Producer`` shared by 8 threads and a ``smartnsq.sync.Consumer`` with a
    plain ``def`` handler (run in its worker threads)."""

    def __init__(self, target: Target, settings: Settings, record: Workload, pace: float) -> None:
        self.target, self.settings, self.record, self.pace = target, settings, record, pace
        self._publishing = threading.Event()
        self._threads: list[threading.Thread] = []
        self._producer = smartnsq.sync.Producer(
            **_addresses(target, True), **settings.producer_kwargs()
        )
        self._consumer = smartnsq.sync.Consumer(
            target.topic,
            target.channel,
            record.handle,
            **_addresses(target, False),
            **settings.consumer_kwargs(),
        )

    def _publisher(self, task: int) -> None:
        while self._publishing.is_set():
            body, kwargs = self.record.next_publish(task)
            try:
                self._producer.publish(self.target.topic, body, **kwargs)
            except Exception as exc:
                self.record.error(exc)
                time.sleep(ERROR_PAUSE)
            else:
                self.record.ack(body)
            time.sleep(self.pace)  # pacing, not synchronisation

    def start(self) -> None:
        self._producer.__enter__()
        self._consumer.start()
        self._publishing.set()
        for task in range(PUBLISHERS):
            t = threading.Thread(target=self._publisher, args=(task,), daemon=True)
            t.start()
            self._threads.append(t)

    def stop_publishing(self) -> None:
        self._publishing.clear()
        for t in self._threads:
            t.join(60)
            assert not t.is_alive(), "a publishing thread is stuck"

    def producer_stats(self) -> ProducerStats:
        return self._producer.stats()

    def consumer_stats(self) -> ConsumerStats:
        return self._consumer.stats()

    def close(self) -> None:
        self.stop_publishing()
        self._consumer.close()
        self._producer.close()


CLIENTS: dict[str, Callable[[Target, Settings, Workload, float], Clients]] = {
    "async": AsyncClients,
    "sync": SyncClients,
}


def wait(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    describe: Callable[[], str] | None = None,
) -> float:
    """Poll ``predicate`` until truthy; returns the time it took; fails after ``timeout``."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            extra = f": {describe()}" if describe else ""
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}{extra}")
        time.sleep(0.05)
    return time.monotonic() - started
