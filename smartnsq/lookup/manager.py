"""Lookup manager: which lookupds exist, which answer, and what they say about a topic.

* Seeds are expanded through ``/listlookup`` into every lookupd of the cluster (Youzan). A 404,
  an empty body or a classic lookupd means "use the seed itself". Seeds are never dropped.
* Lookupds that fail are ranked down with a growing back-off and asked again once it expires;
  one that answers again is back at the top.
* A topic lookup asks every healthy lookupd at once and merges the answers: the union of
  nodes, and for each partition the leader reported by the cluster's leader lookupd when it
  answered, else by the last lookupd to answer.
* :meth:`LookupManager.refresh` is what producers and consumers call on cluster errors:
  concurrent callers share one request, and a topic is re-queried at most once per
  ``min_refresh_interval``, so a burst of errors makes one request, not hundreds.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
import httpx

from smartnsq import _checks
from smartnsq.errors import LookupFailed, TopicNotFound
from smartnsq.lookup.client import ACCEPT, check_lookupd_addresses, fetch_lookup
from smartnsq.lookup.model import Node, TopicLayout, TopicMeta, unwrap

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
    """Discovers lookupds and answers topic lookups with failover. Use ``async with``."""

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
    ) -> None:
        _checks.check_lookup_options(seeds, timeout, listlookup_interval, min_refresh_interval,
                                     max_backoff, cache_ttl, cache_jitter)  # fmt: skip
        self.seeds = check_lookupd_addresses(seeds)
        if not self.seeds:
            raise LookupFailed("no lookupd addresses given")
        self.timeout = timeout
        self.listlookup_interval = listlookup_interval
        self.min_refresh_interval = min_refresh_interval
        self.max_backoff = max_backoff
        self.cache_ttl = cache_ttl
        self.cache_jitter = cache_jitter
        self._known: list[str] = list(self.seeds)
        self._leader: str | None = None
        self._listed_at = -float("inf")
        self._health: dict[str, _Health] = {}
        # (topic, access) -> (fetched at, expires at, layout)
        self._cache: dict[tuple[str, str], tuple[float, float, TopicLayout]] = {}
        self._pending: dict[tuple[str, str], _Pending] = {}
        self._client: httpx.AsyncClient | None = None

    async def __aenter__(self) -> LookupManager:
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(self.timeout, connect=min(2.0, self.timeout)),
            limits=httpx.Limits(max_keepalive_connections=8),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    @property
    def client(self) -> httpx.AsyncClient:
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

    def _failed(self, url: str, exc: Exception) -> None:
        h = self._health.setdefault(url, _Health())
        h.failures += 1
        delay = min(self.max_backoff, 0.5 * 2 ** min(h.failures, 10))
        h.retry_at = time.monotonic() + delay * random.uniform(0.5, 1.0)
        if not h.reported:
            h.reported = True
            log.warning(
                "lookupd %s failed: %s (ranked down; logged once until it recovers)", url, exc
            )

    def _succeeded(self, url: str) -> None:
        h = self._health.get(url)
        if h is not None and h.failures:
            log.info("lookupd %s answers again", url)
            self._health[url] = _Health()

    def _usable(self, url: str, now: float) -> bool:
        h = self._health.get(url)
        return h is None or h.failures == 0 or h.retry_at <= now

    async def discover(self, force: bool = False) -> list[str]:
        """Expand the seeds with ``/listlookup`` (at most every ``listlookup_interval``)."""
        now = time.monotonic()
        if not force and now - self._listed_at < self.listlookup_interval:
            return self._known
        self._listed_at = now
        found: dict[str, None] = dict.fromkeys(self.seeds)
        leader: str | None = None
        for seed in self.seeds:
            try:
                resp = await self.client.get(f"{seed}/listlookup", headers=ACCEPT)
            except httpx.HTTPError as exc:
                self._failed(seed, exc)
                continue
            if resp.status_code == 404 or not resp.content.strip():
                continue  # classic lookupd, or not HA: the seed is its own cluster
            if resp.status_code != 200:
                self._failed(seed, LookupFailed(f"/listlookup answered HTTP {resp.status_code}"))
                continue
            try:
                data = unwrap(resp.json())
            except ValueError:
                continue
            if not isinstance(data, dict):
                continue
            for node in data.get("lookupdnodes") or []:
                url = _node_url(node)
                if url:
                    found[url] = None
            leader = _node_url(data.get("lookupdleader")) or leader
        self._known = list(found)
        self._leader = leader
        return self._known

    @property
    def leader(self) -> str | None:
        """Base URL of the Youzan cluster's leader lookupd, when known."""
        return self._leader

    # -- topic lookups ---------------------------------------------------------------------------

    async def lookup(self, topic: str, access: str = "r") -> TopicLayout:
        """Ask the lookupds about ``topic``, merge their answers and cache the result.

        ``access`` is ``"r"`` (consumers) or ``"w"`` (producers). For ``"w"`` a topic no
        lookupd knows raises :class:`TopicNotFound`; for ``"r"`` it is an empty layout.
        """
        await self.discover()
        now = time.monotonic()
        candidates = [u for u in self.ranked() if self._usable(u, now)] or self.ranked()
        answers: list[tuple[str, TopicLayout]] = []
        missing = 0
        errors: list[str] = []

        async def ask(url: str) -> None:
            nonlocal missing
            try:
                layout = await fetch_lookup(self.client, url, topic, access=access)
            except TopicNotFound:
                self._succeeded(url)
                missing += 1
                return
            except LookupFailed as exc:
                self._failed(url, exc)
                errors.append(str(exc))
                return
            self._succeeded(url)
            answers.append((url, layout))

        async with anyio.create_task_group() as tg:
            for url in candidates:
                tg.start_soon(ask, url)
        if not answers:
            if missing:
                if access == "w":
                    raise TopicNotFound(
                        f"topic {topic!r} does not exist (or has no channel yet) according to "
                        f"{missing} lookupd(s)"
                    )
                layout = TopicLayout()
            else:
                raise LookupFailed(f"no lookupd answered for topic {topic!r}: {'; '.join(errors)}")
        else:
            layout = self._merge(answers)
        now = time.monotonic()
        j = self.cache_jitter
        self._cache[(topic, access)] = (
            now,
            now + self.cache_ttl * random.uniform(1 - j, 1 + j),
            layout,
        )
        return layout

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
        if pending is not None:
            await pending.done.wait()
            if pending.error is not None:
                raise pending.error
            assert pending.layout is not None
            return pending.layout
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


def _node_url(node: object) -> str | None:
    if not isinstance(node, dict):
        return None
    ip, port = node.get("NodeIP"), node.get("HttpPort")
    if not ip or not port:
        return None
    return f"http://{ip}:{port}"
