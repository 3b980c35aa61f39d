"""Prometheus metrics for producers and consumers (``pip install 'smartnsq[prometheus]'``).

::

    from smartnsq.observe import prometheus

    prometheus.register(producer)                       # prometheus_client's default registry
    prometheus.register(consumer, labels={"app": "billing"})

The collector reads :meth:`~smartnsq.Producer.stats` / :meth:`~smartnsq.Consumer.stats` when
Prometheus scrapes, so publishing and consuming pay nothing for it. Registered clients are
held weakly: one that is garbage-collected drops out of the metrics.

Producer metrics (label ``nsqd`` where per node): ``nsq_producer_published_messages_total``,
``nsq_producer_requests_total``, ``nsq_producer_request_errors_total``,
``nsq_producer_connections``, ``nsq_producer_pending_requests``, ``nsq_producer_nsqd_down``,
and without ``nsqd``: ``nsq_producer_failed_messages_total``, ``nsq_producer_retries_total``.

Consumer metrics (labels ``topic``, ``channel``): ``nsq_consumer_received_messages_total``,
``nsq_consumer_finished_messages_total``, ``nsq_consumer_requeued_messages_total``,
``nsq_consumer_discarded_messages_total``, ``nsq_consumer_refused_answers_total`` (FINs and
REQs nsqd refused), ``nsq_consumer_connections``, ``nsq_consumer_in_flight``,
``nsq_consumer_backoff_level``; per connection (also ``nsqd``,
``partition``, empty on classic nsqd): ``nsq_consumer_connection_rdy``,
``nsq_consumer_connection_in_flight``, ``nsq_consumer_connection_received_messages_total``.

Consumer lag (labels ``topic``, ``channel``, ``nsqd``, ``partition``):
``smartnsq_consumer_lag_messages``, the messages the channel has not consumed yet
(:meth:`smartnsq.Consumer.lag`). Unlike the others it is not read at scrape time: a thread per
consumer asks nsqd every ``lag_interval`` seconds (HTTP kept off the hot path and the scrape);
a failed poll keeps the last figures and is logged once.
"""

from __future__ import annotations

import functools
import re
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import anyio
from prometheus_client.core import REGISTRY, CollectorRegistry, Metric
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

from smartnsq.consumer import Consumer
from smartnsq.errors import InvalidArgument, InvalidType, NSQError
from smartnsq.lag import ChannelLag
from smartnsq.observe.lagpoll import LagPoller
from smartnsq.producer import Producer
from smartnsq.stats import ConsumerStats, ProducerStats
from smartnsq.sync.consumer import Consumer as SyncConsumer
from smartnsq.sync.producer import Producer as SyncProducer

__all__ = ["NsqCollector", "register", "unregister"]

_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_OURS = frozenset({"nsqd", "partition", "topic", "channel"})

Client = Producer | SyncProducer | Consumer | SyncConsumer

_PRODUCER_NODE = (
    # (name, help, kind, field of ProducerNodeStats)
    ("nsq_producer_published_messages", "Messages acknowledged by nsqd", "counter", "published"),
    ("nsq_producer_requests", "Publish requests acknowledged by nsqd", "counter", "requests"),
    ("nsq_producer_request_errors", "Publish requests that failed", "counter", "errors"),
    ("nsq_producer_connections", "Open producer connections", "gauge", "connections"),
    ("nsq_producer_pending_requests", "Requests awaiting an answer", "gauge", "pending"),
    ("nsq_producer_nsqd_down", "1 while the nsqd is avoided after a failure", "gauge", "down"),
)
_PRODUCER = (
    ("nsq_producer_failed_messages", "Messages of publish calls that raised", "counter", "failed"),
    ("nsq_producer_retries", "Publish requests sent again after a failure", "counter", "retried"),
)
_CONSUMER = (
    ("nsq_consumer_received_messages", "Messages received", "counter", "received"),
    ("nsq_consumer_finished_messages", "Messages finished", "counter", "finished"),
    ("nsq_consumer_requeued_messages", "Messages requeued", "counter", "requeued"),
    ("nsq_consumer_discarded_messages", "Messages given up on", "counter", "discarded"),
    ("nsq_consumer_refused_answers", "FINs and REQs nsqd refused", "counter", "refused"),
    ("nsq_consumer_connections", "Subscribed connections", "gauge", "connections"),
    ("nsq_consumer_in_flight", "Messages received and not answered", "gauge", "in_flight"),
    ("nsq_consumer_backoff_level", "Backoff level (0: not backing off)", "gauge", "backoff_level"),
)
_CONSUMER_NODE = (
    ("nsq_consumer_connection_rdy", "RDY count of the connection", "gauge", "rdy"),
    ("nsq_consumer_connection_in_flight", "Messages in flight on it", "gauge", "in_flight"),
    ("nsq_consumer_connection_received_messages", "Messages received on it", "counter", "received"),
)


def _family(
    name: str, doc: str, kind: str, labels: list[str]
) -> CounterMetricFamily | GaugeMetricFamily:
    if kind == "counter":
        return CounterMetricFamily(name, doc, labels=labels)
    return GaugeMetricFamily(name, doc, labels=labels)


class NsqCollector:
    """A Prometheus collector for any number of producers and consumers.

    :func:`register` keeps one per registry; use it directly only to manage registration
    yourself (``registry.register(collector)``).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: weakref.WeakKeyDictionary[Any, dict[str, str]] = weakref.WeakKeyDictionary()
        self._lag: weakref.WeakKeyDictionary[Any, LagPoller] = weakref.WeakKeyDictionary()

    def add(
        self,
        client: Client,
        labels: Mapping[str, str] | None = None,
        *,
        lag_interval: float | None = None,
        nsqd_http_addresses: Sequence[str] = (),
    ) -> None:
        """Expose ``client``'s stats, with ``labels`` on every sample.

        Args:
            client: A :class:`smartnsq.Producer`, :class:`smartnsq.sync.Producer`,
                :class:`smartnsq.Consumer` or :class:`smartnsq.sync.Consumer`.
            labels: Extra constant labels (say ``{"app": "billing"}``); needed to tell two
                producers (or two consumers of one topic and channel) apart.
            lag_interval: Consumers: seconds between two lag polls; None: no lag gauge.
            nsqd_http_addresses: Consumers: nsqd HTTP addresses for the lag poll, needed
                when the consumer has no lookupd.

        Raises:
            InvalidType: ``client`` is none of those, or a label is not a string.
            InvalidArgument: A label name is invalid or taken, or another registered client
                would give the same series.
        """
        fixed = _check_labels(labels)
        identity = _identity(client, fixed)
        with self._lock:
            for other, other_labels in self._clients.items():
                if other is not client and _identity(other, other_labels) == identity:
                    raise InvalidArgument(
                        f"another {type(client).__name__} with the same labels {fixed} is "
                        "registered: give each a distinct labels={...}"
                    )
            self._clients[client] = fixed
            if lag_interval is not None and not isinstance(client, Producer | SyncProducer):
                check_interval(lag_interval)
                old = self._lag.pop(client, None)
                if old is not None:
                    old.stop()
                fetch = _lag_fetch(weakref.ref(client), tuple(nsqd_http_addresses))
                self._lag[client] = LagPoller(fetch, lag_interval, "/".join(_topic(client)))

    def remove(self, client: Client) -> None:
        """Stop exposing ``client`` (nothing happens if it was not added)."""
        with self._lock:
            self._clients.pop(client, None)
            poller = self._lag.pop(client, None)
        if poller is not None:
            poller.stop()

    def __len__(self) -> int:
        return len(self._clients)

    def describe(self) -> list[Metric]:
        """The metric families, without samples (what the registry checks for clashes)."""
        return list(self._families(()))

    def collect(self) -> Iterator[Metric]:
        """Read every client's stats now and yield them as metric families."""
        with self._lock:
            clients = list(self._clients.items())
        yield from self._families(clients)

    def _families(self, clients: Any) -> Iterator[Metric]:
        keys = sorted({k for _, labels in clients for k in labels})
        producers, consumers, lags = [], [], []
        for client, labels in clients:
            poller = self._lag.get(client)
            if poller is not None:
                lags.append((poller.last(), [*_topic(client), *[labels.get(k, "") for k in keys]]))
            extra = [labels.get(k, "") for k in keys]
            try:
                if isinstance(client, Producer | SyncProducer):
                    producers.append((client.stats(), extra))
                else:
                    consumers.append((client.stats(), [*_topic(client), *extra]))
            except NSQError:  # a sync Consumer not started yet: nothing to show
                continue
        yield from _producer_families(producers, keys)
        yield from _consumer_families(consumers, keys)
        family = GaugeMetricFamily(
            "smartnsq_consumer_lag_messages",
            "Messages the channel has not consumed yet (last poll)",
            labels=["topic", "channel", *keys, "nsqd", "partition"],
        )
        for last, extra in lags:
            for (nsqd, partition), value in sorted(last.items(), key=str):
                family.add_metric(
                    [*extra, nsqd, "" if partition is None else str(partition)], value
                )
        yield family


def _producer_families(
    producers: list[tuple[ProducerStats, list[str]]], keys: list[str]
) -> Iterator[Metric]:
    for name, doc, kind, field in _PRODUCER:
        family = _family(name, doc, kind, keys)
        for stats, extra in producers:
            family.add_metric(extra, getattr(stats, field))
        yield family
    for name, doc, kind, field in _PRODUCER_NODE:
        family = _family(name, doc, kind, [*keys, "nsqd"])
        for stats, extra in producers:
            for address, node in stats.nodes.items():
                family.add_metric([*extra, address], float(getattr(node, field)))
        yield family


def _consumer_families(
    consumers: list[tuple[ConsumerStats, list[str]]], keys: list[str]
) -> Iterator[Metric]:
    labels = ["topic", "channel", *keys]
    for name, doc, kind, field in _CONSUMER:
        family = _family(name, doc, kind, labels)
        for stats, extra in consumers:
            family.add_metric(extra, getattr(stats, field))
        yield family
    for name, doc, kind, field in _CONSUMER_NODE:
        family = _family(name, doc, kind, [*labels, "nsqd", "partition"])
        for stats, extra in consumers:
            for node in stats.nodes.values():
                part = "" if node.partition is None else str(node.partition)
                family.add_metric([*extra, node.address, part], getattr(node, field))
        yield family


def check_interval(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidArgument(
            f"lag_interval must be a number of seconds > 0 (or None), not {value!r}"
        )


def _lag_fetch(
    ref: weakref.ReferenceType[Any], nsqd_http_addresses: tuple[str, ...]
) -> Callable[[], list[ChannelLag]]:
    """The poll of one consumer; held weakly, so that a consumer dropped without
    unregistering ends its poller instead of living on in it."""

    def fetch() -> list[ChannelLag]:
        client = ref()
        if client is None:
            return []
        if isinstance(client, Consumer):
            lag = functools.partial(client.lag, nsqd_http_addresses=nsqd_http_addresses)
            return anyio.run(lag)
        result: list[ChannelLag] = client.lag(nsqd_http_addresses=nsqd_http_addresses)
        return result

    return fetch


def _topic(client: Consumer | SyncConsumer) -> tuple[str, str]:
    return client.topic, client.channel


def _identity(client: Any, labels: dict[str, str]) -> tuple[Any, ...]:
    kind = "producer" if isinstance(client, Producer | SyncProducer) else "consumer"
    where = () if kind == "producer" else _topic(client)
    return kind, where, tuple(sorted(labels.items()))


def _check_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise InvalidType(f"labels must be a mapping of str to str, not {type(labels).__name__}")
    fixed = {}
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidType(f"labels must map str to str; got {key!r}: {value!r}")
        if not _LABEL.match(key) or key.startswith("__"):
            raise InvalidArgument(f"{key!r} is not a valid Prometheus label name")
        if key in _OURS:
            raise InvalidArgument(f"label {key!r} is set by smartnsq; choose another name")
        fixed[key] = value
    return fixed


_collectors: weakref.WeakKeyDictionary[CollectorRegistry, NsqCollector] = (
    weakref.WeakKeyDictionary()
)
_collectors_lock = threading.Lock()


def register(
    client: Client,
    registry: CollectorRegistry | None = None,
    *,
    labels: Mapping[str, str] | None = None,
    lag_interval: float | None = 30.0,
    nsqd_http_addresses: Sequence[str] = (),
) -> NsqCollector:
    """Expose a producer's or consumer's stats in a Prometheus registry.

    Args:
        client: A :class:`smartnsq.Producer`, :class:`smartnsq.sync.Producer`,
            :class:`smartnsq.Consumer` or :class:`smartnsq.sync.Consumer`.
        registry: Where to register; prometheus_client's default ``REGISTRY`` if omitted.
        labels: Extra constant labels for this client's samples; two producers (or two
            consumers of the same topic and channel) in one registry need distinct ones.
        lag_interval: Consumers: seconds between two polls of the consumer's lag
            (``smartnsq_consumer_lag_messages``), default 30; None: no lag gauge, no poll.
        nsqd_http_addresses: Consumers without a lookupd: the nsqd HTTP addresses to ask
            for the lag (without them the poll fails, and says so once in the log).

    Returns:
        The registry's :class:`NsqCollector` (one per registry, shared by its clients).

    Raises:
        InvalidType: ``client`` or ``labels`` has the wrong type.
        InvalidArgument: A label is invalid, or the client's series would clash with
            another's.
    """
    if not isinstance(client, Producer | SyncProducer | Consumer | SyncConsumer):
        raise InvalidType(
            "register takes a smartnsq Producer or Consumer (async or sync), "
            f"not {type(client).__name__}"
        )
    if registry is None:
        registry = REGISTRY
    elif not isinstance(registry, CollectorRegistry):
        raise InvalidType(f"registry must be a CollectorRegistry, not {type(registry).__name__}")
    with _collectors_lock:
        collector = _collectors.get(registry)
        if collector is None:
            collector = _collectors[registry] = NsqCollector()
            registry.register(collector)
    collector.add(
        client, labels, lag_interval=lag_interval, nsqd_http_addresses=nsqd_http_addresses
    )
    return collector


def unregister(client: Client, registry: CollectorRegistry | None = None) -> None:
    """Stop exposing ``client`` in ``registry`` (the default ``REGISTRY`` if omitted)."""
    collector = _collectors.get(REGISTRY if registry is None else registry)
    if collector is not None:
        collector.remove(client)
