"""Consuming several topics at once (``tail`` and ``to-file``): named topics, or every topic
that matches a pattern. A topic lookupd does not know yet is announced on stderr, as
nsq_tail's TOPIC_NOT_FOUND is, and waited for until it appears."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.abc

from smartnsq import Consumer, serve
from smartnsq.cli.options import CliError, Common
from smartnsq.cli.statdata import get_json
from smartnsq.cli.status import Verdict, exit_now, signal_status
from smartnsq.errors import NSQError
from smartnsq.lookup.manager import LookupManager
from smartnsq.net.http import HttpClient, HttpError

__all__ = ["Serve", "TopicRunner", "serving"]

WAIT_POLL = 1.0  # how often a missing topic is looked up again, in seconds


Serve = Callable[[str], Coroutine[Any, Any, None]]


def serving(make: Callable[[str], Consumer]) -> Serve:
    """A topic's run: ``serve`` the Consumer ``make`` builds (the runner handles signals)."""

    async def run(topic: str) -> None:
        await serve(make(topic), signals=())

    return run


class TopicRunner:
    """Run each topic's consumer (``serve_topic(topic)``, which should return once it is
    cancelled and its consumer has stopped gracefully) until a signal, :meth:`stop`, or
    every one of them returned.

    The first SIGINT or SIGTERM stops gracefully and is recorded in ``verdict``; a second
    one calls ``again`` (default: leave at once with the first signal's status), so it never
    falls through to the signal's default action while the stop runs."""

    def __init__(
        self,
        command: str,
        options: Common,
        serve_topic: Serve,
        *,
        refresh: float = 60.0,
        verdict: Verdict | None = None,
        again: Callable[[int], None] | None = None,
    ) -> None:
        self.command = command
        self.options = options
        self.serve_topic = serve_topic
        self.refresh = refresh
        self.verdict = verdict or Verdict(command)
        self.again = again or _leave
        self.started: set[str] = set()
        self._scope: anyio.CancelScope | None = None
        self._stopped = False
        self.stopping = anyio.Event()  # set by the first stop: handlers waiting may give up

    def stop(self) -> None:
        """Stop every consumer (gracefully: their held messages are requeued)."""
        self._stopped = True
        self.stopping.set()
        if self._scope is not None:
            self._scope.cancel()

    def say(self, text: str) -> None:
        print(f"smartnsq {self.command}: {text}", file=sys.stderr, flush=True)

    async def run(self, topics: list[str], pattern: re.Pattern[str] | None = None) -> None:
        async with anyio.create_task_group() as tg:
            # The watcher outlives the topics' graceful stop: a second signal meanwhile is
            # answered by ``again``, not by the signal's default action.
            tg.start_soon(self.verdict.watch_signals, self.stop, self.again)
            with anyio.CancelScope() as self._scope:
                if self._stopped:
                    self._scope.cancel()
                async with anyio.create_task_group() as topics_tg:
                    for topic in topics:
                        topics_tg.start_soon(self._one, topic)
                    if pattern is not None:
                        topics_tg.start_soon(self._follow, pattern, topics_tg)
            tg.cancel_scope.cancel()  # every topic's run returned: stop watching signals

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
        await self.serve_topic(topic)

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


def _leave(signum: int) -> None:
    exit_now(signal_status(signum))
