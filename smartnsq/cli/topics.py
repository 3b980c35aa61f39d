"""Consuming several topics at once (``tail`` and ``to-file``): named topics, or every topic
that matches a pattern. A topic lookupd does not know yet is announced on stderr, as
nsq_tail's TOPIC_NOT_FOUND is, and waited for until it appears."""

from __future__ import annotations

import re
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.abc

from smartnsq import Consumer, serve
from smartnsq.cli.options import CliError, Common
from smartnsq.cli.statdata import get_json
from smartnsq.errors import NSQError
from smartnsq.http import HttpClient, HttpError
from smartnsq.lookup.manager import LookupManager

__all__ = ["TopicRunner"]

WAIT_POLL = 1.0  # how often a missing topic is looked up again, in seconds


class TopicRunner:
    """Run one Consumer per topic until a signal, :meth:`stop`, or the consumers end.

    ``background`` (the to-file syncer) runs until every consumer has stopped, so the
    handlers still running at the stop can finish with its help.
    """

    def __init__(
        self,
        command: str,
        options: Common,
        make: Callable[[str], Consumer],
        *,
        refresh: float = 60.0,
    ) -> None:
        self.command = command
        self.options = options
        self.make = make
        self.refresh = refresh
        self.started: set[str] = set()
        self._scope: anyio.CancelScope | None = None
        self._stopped = False

    def stop(self) -> None:
        """Stop every consumer (gracefully: their held messages are requeued)."""
        self._stopped = True
        if self._scope is not None:
            self._scope.cancel()

    def say(self, text: str) -> None:
        print(f"smartnsq {self.command}: {text}", file=sys.stderr, flush=True)

    async def run(
        self,
        topics: list[str],
        pattern: re.Pattern[str] | None = None,
        background: Callable[[], Coroutine[Any, Any, None]] | None = None,
    ) -> None:
        async with anyio.create_task_group() as outer:
            if background is not None:
                outer.start_soon(background)
            async with anyio.create_task_group() as inner:
                self._scope = inner.cancel_scope
                if self._stopped:
                    inner.cancel_scope.cancel()
                inner.start_soon(self._signals)
                for topic in topics:
                    inner.start_soon(self._one, topic)
                if pattern is not None:
                    inner.start_soon(self._follow, pattern, inner)
                if not topics and pattern is None:
                    inner.cancel_scope.cancel()
            outer.cancel_scope.cancel()

    async def _signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                self.stop()
                return

    async def _one(self, topic: str) -> None:
        self.started.add(topic)
        if self.options.lookupd and not self.options.nsqd and not await self._known(topic):
            self.say(
                f"topic {topic!r} not found (TOPIC_NOT_FOUND from lookupd); "
                "waiting for it to appear"
            )
            while not await self._known(topic):
                await anyio.sleep(WAIT_POLL)
            self.say(f"topic {topic!r} appeared")
        await serve(self.make(topic), signals=())

    async def _known(self, topic: str) -> bool:
        """Whether some lookupd lists an nsqd for ``topic``."""
        try:
            async with LookupManager(self.options.lookupd) as lookup:
                layout = await lookup.lookup(topic)
        except NSQError:
            return False  # the lookupds are unreachable for now: keep waiting
        return bool(layout.producers or layout.partitions)

    async def _follow(self, pattern: re.Pattern[str], tg: anyio.abc.TaskGroup) -> None:
        """Start a consumer for each new topic that matches, asking every ``refresh``."""
        client = HttpClient()
        while True:
            for topic in sorted(await self._all_topics(client)):
                if topic not in self.started and pattern.search(topic):
                    self.say(f"topic {topic!r} matches --topic-pattern: following it")
                    tg.start_soon(self._one, topic)
                    self.started.add(topic)
            await anyio.sleep(self.refresh)

    async def _all_topics(self, client: HttpClient) -> set[str]:
        found: set[str] = set()
        try:
            async with LookupManager(self.options.lookupd) as lookup:
                urls = await lookup.discover()
        except NSQError:
            return found
        for url in urls:
            try:
                body = await get_json(client, f"{url}/topics")
            except (CliError, NSQError, HttpError, TimeoutError, ValueError, OSError):
                continue
            found.update(str(t) for t in (body or {}).get("topics") or [])
        return found
