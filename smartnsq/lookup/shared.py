"""One lookupd poll for the consumers of an event loop.

Each consumer used to poll its lookupds on its own: 1,000 consumers in one process made ~17
requests a second, each on its own connection, and kept 1,000 lookup states. Consumers on one
event loop with the same lookupds and poll settings now share one :class:`LookupManager` and
one schedule. When every lookupd is classic and several topics are polled, a round is one
``/nodes`` request per lookupd, answering for every topic; Youzan lookupds (partition leaders,
topic metadata) are still asked topic by topic.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import anyio
from anyio.lowlevel import RunVar

from smartnsq.errors import LookupFailed
from smartnsq.lookup.manager import LookupManager
from smartnsq.lookup.model import Node, TopicLayout

# From how many topics one /nodes answer (every topic of every nsqd) is cheaper than asking
# topic by topic.
BATCH_FROM = 4

_Key = tuple[tuple[str, ...], float, float]
_SHARED: RunVar[dict[_Key, SharedLookup]] = RunVar("smartnsq.lookup.shared")


class SharedLookup:
    """The lookup state and poll schedule the consumers of one event loop share.

    Get one with :func:`shared_lookup`. ``due`` is when the next shared round is due
    (``anyio.current_time()``); :meth:`poll` answers it, once for every topic when
    :attr:`batched`.
    """

    def __init__(self, seeds: Sequence[str], interval: float, jitter: float) -> None:
        self.manager = LookupManager(seeds, listlookup_interval=interval)
        self.interval = interval
        self.jitter = jitter
        self.topics: Counter[str] = Counter()  # topic -> consumers polling it
        self.failed = 0  # rounds in a row that reached no lookupd
        self.due = anyio.current_time() + poll_wait(interval, jitter, 0)
        self._answer: tuple[float, dict[str, tuple[Node, ...]] | None] | None = None
        self._pending: anyio.Event | None = None

    @property
    def batched(self) -> bool:
        """Whether a round is one ``/nodes`` request for every topic."""
        return len(self.topics) >= BATCH_FROM and self.manager.every_topic_at_once

    async def lookup(self, topic: str) -> TopicLayout:
        """Ask about one topic now (the first lookup, a re-query after a lost connection)."""
        return await self.manager.lookup(topic, "r")

    async def poll(self, topic: str, due: float) -> TopicLayout:
        """The layout of ``topic`` from the round due at ``due``: the first caller of a
        round asks, the others share its answer. Falls back to :meth:`lookup` when the
        round's ``/nodes`` requests failed."""
        while True:
            if self._answer is not None and self._answer[0] >= due:
                found = self._answer[1]
                if found is None:
                    return await self.lookup(topic)
                return TopicLayout(found.get(topic, ()))
            if self._pending is not None:
                await self._pending.wait()  # a caller cancelled mid-round leaves no answer
                continue
            self._pending = done = anyio.Event()
            started = anyio.current_time()
            try:
                found = None
                found = await self.manager.every_topic()
            except LookupFailed:
                pass  # each caller asks for its own topic
            finally:
                self._pending = None
                done.set()
            self._answer = (started, found)
            self.failed = 0 if found is not None else self.failed + 1
            self._schedule()

    def _schedule(self) -> None:
        self.due = anyio.current_time() + poll_wait(self.interval, self.jitter, self.failed)


def poll_wait(interval: float, jitter: float, failed: int) -> float:
    """How long until the next lookupd poll: ``interval`` with ``jitter``, or after
    ``failed`` polls in a row reached no lookupd, soon (1, 2, 4 s ...): a consumer started
    while its lookupds were briefly unreachable must not spend a whole interval (60 s by
    default) doing nothing."""
    wait = interval * random.uniform(1 - jitter, 1 + jitter)
    if failed:
        wait = min(wait, 2.0 ** min(failed - 1, 10) * random.uniform(0.75, 1.0))
    return wait


@asynccontextmanager
async def shared_lookup(
    seeds: Sequence[str], topic: str, *, interval: float, jitter: float
) -> AsyncIterator[SharedLookup]:
    """The :class:`SharedLookup` for ``seeds`` on this event loop, with ``topic`` counted
    among its topics while inside."""
    key: _Key = (tuple(seeds), interval, jitter)
    registry = _SHARED.get(None)
    if registry is None:
        registry = {}
        _SHARED.set(registry)
    shared = registry.get(key)
    if shared is None:
        shared = registry[key] = SharedLookup(seeds, interval, jitter)
        await shared.manager.__aenter__()
    shared.topics[topic] += 1
    try:
        yield shared
    finally:
        shared.topics[topic] -= 1
        if shared.topics[topic] <= 0:
            del shared.topics[topic]
        if not shared.topics and registry.get(key) is shared:
            del registry[key]
            await shared.manager.__aexit__(None, None, None)


__all__ = ["BATCH_FROM", "SharedLookup", "poll_wait", "shared_lookup"]
