"""Lookup manager: which lookupds exist, which answer, and what they say about a topic.

* Seeds are expanded through ``/listlookup`` into every lookupd of the cluster (Youzan). A 404,
  an empty body or a classic lookupd means "use the seed itself". Seeds are never dropped.
* Lookupds that fail are ranked down with a growing back-off and asked again once it expires;
  one that answers again is back at the top.
* A topic lookup asks every healthy lookupd at once and merges the answers: the union of
  nodes, and for each partition the leader reported by the cluster's leader lookupd when it
  answered, else by the last lookupd to answer.
* Every request has ``timeout`` for the whole exchange, body included, and a body is read up
  to ``max_response_size``. Once one lookupd has given a useful answer the others get
  ``answer_grace`` more, so a slow lookupd costs the caller that grace, not its timeout. A
  lookupd that is late, sends too much or sends garbage is ranked down; only
  :class:`LookupFailed` or :class:`TopicNotFound` reach the caller.
* Bad entries in an answer (a producer without a valid port, say) are skipped and the rest
  is used; each kind of problem is logged once per lookupd.
* A producer's lookup (``"w"``) of a topic no classic lookupd knows yet answers with every
  nsqd those lookupds know (``/nodes``): classic nsqd creates a topic on its first PUB. On
  the Youzan fork, where an operator creates topics, it raises :class:`TopicNotFound`.
* :meth:`LookupManager.refresh` is what producers and consumers call on cluster errors:
  concurrent callers share one request, and a topic is re-queried at most once per
  ``min_refresh_interval``, so a burst of errors makes one request, not hundreds.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import anyio

from smartnsq import _checks
from smartnsq.errors import InvalidArgument, LookupFailed, NoNsqdAvailable, TopicNotFound
from smartnsq.lookup.client import (
    MAX_RESPONSE_SIZE,
    NoListLookup,
    NoNodes,
    check_lookupd_addresses,
    fetch_listlookup,
    fetch_lookup,
    fetch_nodes,
    fetch_nsqds,
)
from smartnsq.lookup.model import Node, Skipped, TopicLayout, TopicMeta
from smartnsq.net.http import HttpClient

_T = TypeVar("_T")

# How long "every nsqd" stands for a topic no lookupd knows: once nsqd has created it, it
# registers it with lookupd at once, and its real layout is used from the next lookup on.
NEW_TOPIC_TTL = 5.0

log = logging.getLogger("smartnsq.lookup")


@dataclass(slots=True)
class _Health:
    failures: int = 0
    retry_at: float = 0.0
    reported: bool = False


class _Pending:
    __slots__ = ("done", "error", "layout")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.layout: TopicLayout | None = None
        self.error: Exception | None = None


class LookupManager:
    """Discovers lookupds and answers topic lookups with failover. Use ``async with``.

    ``timeout`` bounds each request to a lookupd (connect to last body byte);
    ``max_response_size`` caps the bytes read from one answer; ``answer_grace`` is how long
    the other lookupds may still answer once one has given a useful answer.
    """

    def __init__(
        self,
        seeds: Sequence[str] | str,
        *,
        timeout: float = 5.0,
        listlookup_interval: float = 60.0,
        min_refresh_interval: float = 1.0,
        max_backoff: float = 30.0,
        cache_ttl: float = 60.0,
        cache_jitter: float = 0.3,
        max_response_size: int = MAX_RESPONSE_SIZE,
        answer_grace: float = 0.25,
    ) -> None:
        _checks.check_lookup_options(seeds, timeout, listlookup_interval, min_refresh_interval,
                                     max_backoff, cache_ttl, cache_jitter)  # fmt: skip
        self.seeds = check_lookupd_addresses(seeds)
        if not self.seeds:
            raise LookupFailed("no lookupd addresses given")
        if not timeout > 0:
            raise InvalidArgument("timeout must be > 0 seconds")
        if isinstance(max_response_size, bool) or not isinstance(max_response_size, int):
            raise InvalidArgument(f"max_response_size must be an int, not {max_response_size!r}")
        if max_response_size < 1:
            raise InvalidArgument("max_response_size must be at least 1 byte")
        if not answer_grace >= 0:
            raise InvalidArgument("answer_grace must be >= 0 seconds")
        self.max_response_size = max_response_size
        self.answer_grace = answer_grace
        self.timeout = timeout
        self.listlookup_interval = listlookup_interval
        self.min_refresh_interval = min_refresh_interval
        self.max_backoff = max_backoff
        self.cache_ttl = cache_ttl
        self.cache_jitter = cache_jitter
        self._known: list[str] = list(self.seeds)
        self._leader: str | None = None
        self._listed_at = -float("inf")
        self._no_listlookup: set[str] = set()  # lookupds that answered 404 to /listlookup
        self.fork = False  # a lookupd answered /listlookup: the Youzan fork
        self._no_nodes: set[str] = set()  # lookupds that refused /nodes
        # every_nsqd's answer and until when it is used: while a topic's nsqd are down,
        # each of its publishes asks, and /nodes is the same for every topic.
        self._every: tuple[float, TopicLayout] | None = None
        self._health: dict[str, _Health] = {}
        # (topic, access) -> (fetched at, expires at, layout)
        self._cache: dict[tuple[str, str], tuple[float, float, TopicLayout]] = {}
        self._pending: dict[tuple[str, str], _Pending] = {}
        self._warned: set[tuple[str, str]] = set()  # (lookupd, problem) already logged
        self._client: HttpClient | None = None

    async def __aenter__(self) -> LookupManager:
        self._client = HttpClient(connect_timeout=min(2.0, self.timeout))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._client = None

    @property
    def client(self) -> HttpClient:
        if self._client is None:
            raise LookupFailed("use the LookupManager inside 'async with'")
        return self._client

    # -- lookupd discovery -----------------------------------------------------------------------

    def ranked(self) -> list[str]:
        """Known lookupds, healthy first, then by how soon a failed one may be asked again."""
        now = time.monotonic()

        def key(url: str) -> tuple[int, float, float]:
            h = self._health.get(url)
            if h is None or h.failures == 0:
                return (0, 0.0, random.random())
            return (1, max(0.0, h.retry_at - now), h.failures)

        return sorted(self._known, key=key)

    def _failed(self, url: str, problem: str) -> None:
        h = self._health.setdefault(url, _Health())
        h.failures += 1
        delay = min(self.max_backoff, 0.5 * 2 ** min(h.failures, 10))
        h.retry_at = time.monotonic() + delay * random.uniform(0.5, 1.0)
        if not h.reported:
            h.reported = True
            log.warning("%s (ranked down; logged once until it recovers)", problem)

    def _succeeded(self, url: str) -> None:
        h = self._health.get(url)
        if h is not None and h.failures:
            log.info("lookupd %s answers again", url)
            self._health[url] = _Health()

    def _usable(self, url: str, now: float) -> bool:
        h = self._health.get(url)
        return h is None or h.failures == 0 or h.retry_at <= now

    async def discover(self, force: bool = False) -> list[str]:
        """Expand the seeds with ``/listlookup`` (at most every ``listlookup_interval``).

        Every seed is asked at once; seeds are kept whatever they answer.
        """
        now = time.monotonic()
        if not force and now - self._listed_at < self.listlookup_interval:
            return self._known
        self._listed_at = now

        async def ask(seed: str) -> tuple[list[str], str | None]:
            if seed in self._no_listlookup:
                return [], None
            skipped: list[Skipped] = []
            try:
                listed = await fetch_listlookup(
                    self.client,
                    seed,
                    timeout=self.timeout,
                    max_response_size=self.max_response_size,
                    skipped=skipped,
                )
            except NoListLookup:
                self._no_listlookup.add(seed)  # classic: its own cluster; never ask again
                return [], None
            self._report(seed, skipped)
            self.fork = True
            return listed

        answers, _ = await self._ask(self.seeds, ask, lambda _: True)
        found: dict[str, None] = dict.fromkeys(self.seeds)
        leader: str | None = None
        for _, (urls, listed_leader) in answers:
            found.update(dict.fromkeys(urls))
            leader = listed_leader or leader
        self._known = list(found)
        self._leader = leader
        return self._known

    async def _ask(
        self,
        urls: Sequence[str],
        request: Callable[[str], Awaitable[_T]],
        useful: Callable[[_T], bool],
    ) -> tuple[list[tuple[str, _T]], list[str]]:
        """Send ``request`` to every lookupd in ``urls`` at once.

        Returns the answers in the order they came, and the errors. After the first useful
        answer the others have ``answer_grace`` left; a lookupd that fails in any way, or is
        still busy then, is ranked down.
        """
        answers: list[tuple[str, _T]] = []
        errors: list[str] = []
        finished: set[str] = set()

        async with anyio.create_task_group() as tg:

            async def one(url: str) -> None:
                try:
                    answer = await request(url)
                except LookupFailed as exc:
                    # its text, not the exception: the exception's frames hold the answer (up
                    # to max_response_size) and would keep it alive in a reference cycle
                    failure = str(exc)
                except Exception as exc:  # whatever one lookupd causes is its failure only
                    log.debug("lookupd %s: unexpected error", url, exc_info=True)
                    failure = f"lookupd {url} failed: {exc!r:.200}"
                else:
                    finished.add(url)
                    answers.append((url, answer))
                    if useful(answer):
                        grace_end = anyio.current_time() + self.answer_grace
                        tg.cancel_scope.deadline = min(tg.cancel_scope.deadline, grace_end)
                    return
                finished.add(url)
                errors.append(failure)
                self._failed(url, failure)

            for url in urls:
                tg.start_soon(one, url)
        for url in urls:
            if url not in finished:
                late = f"lookupd {url} had not answered {self.answer_grace}s after another one did"
                errors.append(late)
                self._failed(url, late)
        return answers, errors

    def _report(self, url: str, skipped: list[Skipped]) -> None:
        """Log skipped entries: each kind of problem once per lookupd, later ones at DEBUG."""
        for problem, entry in skipped:
            key = (url, problem)
            level = logging.DEBUG if key in self._warned else logging.WARNING
            self._warned.add(key)
            log.log(
                level,
                "lookupd %s sent a %s; skipped it, used the rest (once; then at DEBUG): %s",
                url,
                problem,
                entry,
            )

    @property
    def leader(self) -> str | None:
        """Base URL of the Youzan cluster's leader lookupd, when known."""
        return self._leader

    # -- topic lookups ---------------------------------------------------------------------------

    async def lookup(self, topic: str, access: str = "r") -> TopicLayout:
        """Ask the lookupds about ``topic``, merge their answers and cache the result.

        ``access`` is ``"r"`` (consumers) or ``"w"`` (producers). For ``"w"`` a topic no
        lookupd knows is every nsqd the (classic) lookupds know, where nsqd creates it, or
        :class:`TopicNotFound` (the fork); for ``"r"`` it is an empty layout.
        """
        await self.discover()
        candidates = self._candidates()

        async def ask(url: str) -> TopicLayout | None:
            skipped: list[Skipped] = []
            try:
                layout = await fetch_lookup(
                    self.client,
                    url,
                    topic,
                    access=access,
                    timeout=self.timeout,
                    max_response_size=self.max_response_size,
                    skipped=skipped,
                )
            except TopicNotFound:
                layout = None
            self._report(url, skipped)
            self._succeeded(url)
            return layout

        # An answer that lists no nsqd does not start the grace: another lookupd may know more.
        results, errors = await self._ask(
            candidates,
            ask,
            lambda layout: layout is not None and bool(layout.producers or layout.partitions),
        )
        answers = [(url, layout) for url, layout in results if layout is not None]
        missing = [url for url, layout in results if layout is None]
        ttl = self.cache_ttl
        if not answers:
            if missing:
                if access == "w":
                    layout = await self._new_topic(topic, missing)
                    ttl = min(ttl, NEW_TOPIC_TTL)
                else:
                    layout = TopicLayout()
            else:
                raise LookupFailed(f"no lookupd answered for topic {topic!r}: {'; '.join(errors)}")
        else:
            layout = self._merge(answers)
        now = time.monotonic()
        j = self.cache_jitter
        self._cache[(topic, access)] = (now, now + ttl * random.uniform(1 - j, 1 + j), layout)
        return layout

    async def every_nsqd(self, topic: str) -> TopicLayout:
        """Every nsqd the lookupds know (``/nodes``), as a write layout of ``topic``: where a
        producer may publish it when every nsqd listed for it is down (classic nsqd creates
        a topic on its first PUB). Cached for a few seconds.

        Raises:
            TopicNotFound: A lookupd is not classic (the fork: topics are created by an
                operator).
            NoNsqdAvailable: The lookupds list no nsqd (yet).
            LookupFailed: No lookupd answered.
        """
        every = self._every
        if every is not None and time.monotonic() < every[0]:
            return every[1]
        await self.discover()
        layout = await self._new_topic(topic, self._candidates())
        self._every = (time.monotonic() + NEW_TOPIC_TTL, layout)
        return layout

    async def _new_topic(self, topic: str, missing: list[str]) -> TopicLayout:
        """Where a producer may publish ``topic``, which the lookupds in ``missing`` do not
        know: every nsqd they know when all are classic (nsqd creates a topic on its first
        PUB); on the Youzan fork (or when a lookupd cannot list its nsqd) the topic must be
        created first: :class:`TopicNotFound`."""
        not_found = (
            f"topic {topic!r} does not exist (or has no channel yet) according to "
            f"{len(missing)} lookupd(s)"
        )
        classic = [u for u in missing if u in self._no_listlookup and u not in self._no_nodes]
        if len(classic) < len(missing):
            raise TopicNotFound(f"{not_found}; create it first")
        listed: list[str] = []  # the lookupds that answered /nodes, even with no nsqd

        async def ask(url: str) -> tuple[Node, ...]:
            skipped: list[Skipped] = []
            try:
                found = await fetch_nsqds(
                    self.client,
                    url,
                    timeout=self.timeout,
                    max_response_size=self.max_response_size,
                    skipped=skipped,
                )
            except NoNodes:
                self._no_nodes.add(url)
                return ()
            self._report(url, skipped)
            self._succeeded(url)
            listed.append(url)
            return found

        results, errors = await self._ask(classic, ask, bool)
        nodes: dict[Node, None] = {}
        for _, found in results:
            nodes.update(dict.fromkeys(found))
        if not nodes and listed:
            # Not the topic's fault: a lookupd just (re)started lists no nsqd until they
            # register again (nsqd may also all be down). Worth trying again, unlike a topic
            # that must be created first.
            raise NoNsqdAvailable(
                f"{not_found}, and lookupd lists no nsqd to create it on yet (a lookupd that "
                "just started lists none until the nsqd register again)"
            )
        if not nodes:
            why = "; ".join(errors) or "lookupd cannot list its nsqd"
            raise TopicNotFound(f"{not_found}, and no nsqd to create it on was found: {why}")
        log.debug("topic %r is new: publishing to one of the %d nsqd lookupd knows", topic,
                  len(nodes))  # fmt: skip
        return TopicLayout(tuple(nodes))

    def _candidates(self) -> list[str]:
        now = time.monotonic()
        return [u for u in self.ranked() if self._usable(u, now)] or self.ranked()

    @property
    def every_topic_at_once(self) -> bool:
        """Whether :meth:`every_topic` can be used: every known lookupd is classic (it has no
        ``/listlookup``, so no partitions to tell) and none has refused ``/nodes``."""
        return all(u in self._no_listlookup and u not in self._no_nodes for u in self._known)

    async def every_topic(self) -> dict[str, tuple[Node, ...]]:
        """Each topic's nsqd from one ``/nodes`` request per lookupd, all asked at once, the
        union of their answers: what :meth:`lookup` would say for every topic together.

        Raises :class:`LookupFailed` when no lookupd answered, or one refused ``/nodes``
        (then :attr:`every_topic_at_once` turns False).
        """
        await self.discover()
        refused: list[str] = []

        async def ask(url: str) -> dict[str, tuple[Node, ...]]:
            skipped: list[Skipped] = []
            try:
                found = await fetch_nodes(
                    self.client,
                    url,
                    timeout=self.timeout,
                    max_response_size=self.max_response_size,
                    skipped=skipped,
                )
            except NoNodes as exc:  # not the lookupd's failure: it still answers /lookup
                self._no_nodes.add(url)
                refused.append(str(exc))
                return {}
            self._report(url, skipped)
            self._succeeded(url)
            return found

        results, errors = await self._ask(self._candidates(), ask, bool)
        if refused:
            # Its topics are missing from the union: the caller must ask topic by topic.
            raise LookupFailed("; ".join(refused))
        if not results:
            raise LookupFailed(f"no lookupd answered /nodes: {'; '.join(errors)}")
        merged: dict[str, dict[Node, None]] = {}
        for _, found in results:
            for topic, nodes in found.items():
                merged.setdefault(topic, {}).update(dict.fromkeys(nodes))
        return {topic: tuple(nodes) for topic, nodes in merged.items()}

    def _merge(self, answers: list[tuple[str, TopicLayout]]) -> TopicLayout:
        if len(answers) == 1:
            return answers[0][1]
        # The leader's answer is authoritative for partitions; put it last so it wins.
        answers.sort(key=lambda a: a[0] == self._leader)
        producers: dict[Node, None] = {}
        partitions: dict[int, Node] = {}
        meta: TopicMeta | None = None
        for _, layout in answers:
            producers.update(dict.fromkeys(layout.producers))
            partitions.update(layout.partitions)
            if layout.meta is not None and (meta is None or layout.meta.partition_num):
                meta = layout.meta
        return TopicLayout(tuple(producers), partitions, meta)

    def cached(self, topic: str, access: str = "r") -> TopicLayout | None:
        """The last answer, unless it is older than ``cache_ttl`` (with jitter): then None,
        so the caller looks up again and a changed layout is picked up by polling."""
        entry = self._cache.get((topic, access))
        if entry is None or time.monotonic() >= entry[1]:
            return None
        return entry[2]

    async def refresh(self, topic: str, access: str = "r") -> TopicLayout:
        """Re-query on demand, rate-limited and shared between concurrent callers."""
        key = (topic, access)
        entry = self._cache.get(key)
        if entry is not None and time.monotonic() - entry[0] < self.min_refresh_interval:
            return entry[2]
        pending = self._pending.get(key)
        while pending is not None:
            await pending.done.wait()
            if pending.error is not None:
                raise pending.error
            if pending.layout is not None:
                return pending.layout
            # The caller that looked up was cancelled before an answer: look up here (or
            # share the refresh another follower has started meanwhile).
            pending = self._pending.get(key)
        pending = self._pending[key] = _Pending()
        try:
            pending.layout = await self.lookup(topic, access)
            return pending.layout
        except Exception as exc:
            pending.error = exc
            raise
        finally:
            del self._pending[key]
            pending.done.set()
