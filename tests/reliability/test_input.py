"""Input that used to be accepted (and sent, or sent wrongly): every public call now refuses it
with a typed error before anything reaches nsqd."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from smartnsq import Connection, ConnectionConfig, Consumer, Producer
from smartnsq.errors import InvalidArgument, InvalidType, NotSupported
from tests.helpers import channel_stats, create_channel, topic_stats, unique, wait_until

pytestmark = pytest.mark.reliability

Action = Callable[[str, str], Awaitable[None]]
NAN = math.nan
INF = math.inf


def producer(**kw: Any) -> Action:
    """Construct a Producer with ``kw`` and publish one message."""

    async def act(tcp: str, topic: str) -> None:
        k = {"max_retries": 0, **kw}
        async with Producer(k.pop("nsqd_tcp_addresses", [tcp]), **k) as p:
            await p.publish(topic, b"x")

    return act


def publish(topic: Any = None, **kw: Any) -> Action:
    """A good Producer; ``publish`` with ``kw``."""

    async def act(tcp: str, name: str) -> None:
        async with Producer([tcp], max_retries=0) as p:
            await p.publish(name if topic is None else topic, b"x", **kw)

    return act


def publish_many(bodies: Any = (b"x",), **kw: Any) -> Action:
    async def act(tcp: str, topic: str) -> None:
        async with Producer([tcp], max_retries=0) as p:
            await p.publish_many(topic, list(bodies) if type(bodies) is tuple else bodies, **kw)

    return act


def consumer(**kw: Any) -> Action:
    """Construct and start a Consumer with ``kw`` (starting it subscribes: SUB creates the
    topic on nsqd)."""

    async def act(tcp: str, topic: str) -> None:
        k = dict(kw)
        addresses = k.pop("nsqd_tcp_addresses", [tcp])
        async with Consumer(topic, "c", nsqd_tcp_addresses=addresses, **k) as c:
            await wait_until(lambda: c.stats().connections, what="subscription")

    return act


IT, IA = InvalidType, InvalidArgument

CASES: list[Any] = [
    # Producer(...)
    pytest.param(producer(timeout="5"), IT, "timeout must be a number", id="P-timeout-str"),
    pytest.param(producer(timeout=True), IT, "timeout must be a number", id="P-timeout-bool"),
    pytest.param(producer(timeout=NAN), IA, "timeout must be a finite", id="P-timeout-nan"),
    pytest.param(producer(timeout=INF), IA, "timeout must be a finite", id="P-timeout-inf"),
    pytest.param(
        producer(connections_per_nsqd=2.5), IT, "connections_per_nsqd must be an int", id="P-cpn"
    ),
    pytest.param(producer(max_retries=True), IT, "max_retries must be an int", id="P-retries"),
    pytest.param(producer(retry_backoff=-1), IA, "retry_backoff must be >= 0", id="P-backoff-neg"),
    pytest.param(producer(retry_backoff=NAN), IA, "retry_backoff must be a finite", id="P-bo-nan"),
    pytest.param(producer(tls="yes"), IT, "tls must be True, False or an ssl", id="P-tls"),
    pytest.param(producer(auth_secret=123), IT, "auth_secret must be a str, bytes", id="P-secret"),
    pytest.param(producer(identify="x"), IT, "identify must be a mapping", id="P-identify"),
    pytest.param(producer(identify={1: "x"}), IT, "keys must be str", id="P-identify-key"),
    pytest.param(producer(heartbeat_interval=NAN), IA, "finite", id="P-heartbeat-nan"),
    pytest.param(producer(heartbeat_interval="30"), IT, "heartbeat_interval", id="P-hb-str"),
    pytest.param(producer(connect_timeout="5"), IT, "connect_timeout", id="P-connect-str"),
    pytest.param(producer(lookupd_poll_interval="60"), IT, "lookupd_poll_interval", id="P-poll"),
    pytest.param(producer(snappy="yes"), IT, "snappy must be True or False", id="P-snappy"),
    pytest.param(producer(deflate_level="6"), IT, "deflate_level must be an int", id="P-level"),
    pytest.param(producer(client_id=5), IT, "client_id must be a str", id="P-client-id"),
    pytest.param(producer(max_delay="1"), IT, "max_delay must be a number", id="P-max-delay"),
    pytest.param(
        producer(auth_over_plaintext="no"), IT, "auth_over_plaintext", id="P-auth-plaintext"
    ),
    pytest.param(producer(busy_poll="0"), IT, "busy_poll must be a number", id="P-busy-str"),
    pytest.param(producer(busy_poll=-1), IA, "busy_poll must be >= 0", id="P-busy-neg"),
    pytest.param(producer(busy_poll=0.5), IA, "0 turns polling off", id="P-busy-long"),
    pytest.param(
        producer(nsqd_tcp_addresses=None), IT, "list of 'host:port' strings", id="P-addr-none"
    ),
    pytest.param(producer(nsqd_tcp_addresses=[4150]), IT, "'host:port' strings", id="P-addr-int"),
    # publish(...)
    pytest.param(publish(timeout="5"), IT, "timeout must be a number", id="pub-timeout-str"),
    pytest.param(publish(timeout=NAN), IA, "timeout must be a finite", id="pub-timeout-nan"),
    pytest.param(publish(timeout=0), IA, "timeout must be > 0", id="pub-timeout-0"),
    pytest.param(publish(timeout=-1), IA, "timeout must be > 0", id="pub-timeout-neg"),
    pytest.param(publish(timeout=True), IT, "timeout must be a number", id="pub-timeout-bool"),
    pytest.param(publish(topic=["t"]), IT, "topic name must be a str", id="pub-topic-list"),
    pytest.param(publish(delay=1e300), IA, "raise the Producer's max_delay", id="pub-delay-huge"),
    pytest.param(publish(delay=3601), IA, "delay must be <= 3600", id="pub-delay-over-1h"),
    pytest.param(publish(delay=True), IT, "delay must be a number", id="pub-delay-bool"),
    pytest.param(publish(delay="5"), IT, "delay must be a number", id="pub-delay-str"),
    pytest.param(publish(partition=0), NotSupported, "classic nsqd", id="pub-partition-classic"),
    # publish_many(...)
    pytest.param(publish_many(timeout="5"), IT, "timeout must be a number", id="mpub-timeout"),
    pytest.param(publish_many(timeout=NAN), IA, "finite", id="mpub-timeout-nan"),
    pytest.param(publish_many(timeout=0), IA, "timeout must be > 0", id="mpub-timeout-0"),
    pytest.param(publish_many(None), IT, "list of message bodies", id="mpub-none"),
    pytest.param(publish_many(5), IT, "list of message bodies", id="mpub-int"),
    pytest.param(publish_many(trace_ids=5), IT, "trace_ids must be a list", id="mpub-trace-ids"),
    pytest.param(publish_many(partition=0), NotSupported, "classic nsqd", id="mpub-partition"),
    # Consumer(...)
    pytest.param(consumer(max_in_flight="10"), IT, "max_in_flight must be an int", id="C-mif-str"),
    pytest.param(consumer(max_in_flight=2.5), IT, "max_in_flight must be an int", id="C-mif-2.5"),
    pytest.param(consumer(max_in_flight=NAN), IT, "max_in_flight must be an int", id="C-mif-nan"),
    pytest.param(consumer(max_in_flight=INF), IT, "max_in_flight must be an int", id="C-mif-inf"),
    pytest.param(consumer(max_in_flight=True), IT, "max_in_flight must be an int", id="C-mif-bool"),
    pytest.param(consumer(requeue_delay=NAN), IA, "requeue_delay must be a finite", id="C-rq-nan"),
    pytest.param(consumer(max_requeue_delay=1e300), IA, "max_requeue_delay", id="C-maxrq-huge"),
    pytest.param(consumer(msg_timeout=NAN), IA, "msg_timeout must be a finite", id="C-mt-nan"),
    pytest.param(consumer(msg_timeout=0.5), IA, "msg_timeout must be >= 1", id="C-mt-short"),
    pytest.param(consumer(heartbeat_interval=NAN), IA, "heartbeat_interval", id="C-hb-nan"),
    pytest.param(consumer(sample_rate=1.5), IT, "sample_rate must be an int", id="C-sample"),
    pytest.param(consumer(reconnect_max=INF), IA, "reconnect_max must be a finite", id="C-recon"),
    pytest.param(consumer(backoff="no"), IT, "backoff must be True or False", id="C-backoff"),
    pytest.param(consumer(ordered="yes"), IT, "ordered must be True or False", id="C-ordered"),
    pytest.param(consumer(concurrency=2.5), IT, "concurrency must be an int", id="C-concurrency"),
    pytest.param(consumer(lookupd_poll_jitter="0.3"), IT, "lookupd_poll_jitter", id="C-jitter"),
    pytest.param(consumer(on_blocked=5), IT, "on_blocked must be callable", id="C-on-blocked"),
    pytest.param(consumer(blocked_warn_attempts=0), IA, "blocked_warn_attempts", id="C-warn-0"),
    pytest.param(consumer(tls="yes"), IT, "tls must be True, False or an ssl", id="C-tls"),
    pytest.param(consumer(auth_secret=123), IT, "auth_secret must be a str", id="C-secret"),
    pytest.param(consumer(nsqd_tcp_addresses=5), IT, "'host:port' strings", id="C-addr-int"),
]


@pytest.mark.integration
@pytest.mark.anyio
@pytest.mark.parametrize(("action", "error", "phrase"), CASES)
async def test_bad_input_is_refused_before_anything_is_sent(
    classic_cluster: Any, anyio_backend: str, action: Action, error: type, phrase: str
) -> None:
    nsqd = classic_cluster.nsqd[0]
    topic = unique("bad_input")
    with anyio.fail_after(20), pytest.raises(error, match=phrase):
        await action(nsqd.tcp, topic)
    assert topic_stats(nsqd.http, topic) is None  # nothing published, nothing subscribed


@pytest.mark.integration
@pytest.mark.anyio
@pytest.mark.parametrize("scheme", ["tcp", "nsq", "http"])
async def test_nsqd_address_with_a_scheme_says_to_drop_it(
    classic_cluster: Any, anyio_backend: str, scheme: str
) -> None:
    """``tcp://host:port`` used to become host 'tcp://host': an unreachable nsqd after
    retries. It is a plain mistake in the address, said at once."""
    nsqd = classic_cluster.nsqd[0]
    topic = unique("scheme")
    address = f"{scheme}://{nsqd.tcp}"
    with pytest.raises(InvalidArgument, match="use 'host:port' without a scheme"):
        await producer(nsqd_tcp_addresses=[address])(nsqd.tcp, topic)
    with pytest.raises(InvalidArgument, match="use 'host:port' without a scheme"):
        await consumer(nsqd_tcp_addresses=[address])(nsqd.tcp, topic)
    with pytest.raises(InvalidArgument, match="use 'host:port' without a scheme"):
        await Connection.open(address)
    assert topic_stats(nsqd.http, topic) is None


@pytest.mark.integration
@pytest.mark.anyio
async def test_max_delay_can_be_raised_to_what_nsqd_allows(
    cluster_factory: Any, anyio_backend: str
) -> None:
    """The limit is the Producer's, documented, and follows the server's when raised."""
    cluster = cluster_factory("classic", nsqd_args=["--max-req-timeout=2h"])
    nsqd = cluster.nsqd[0]
    topic = unique("long_delay")
    async with Producer([nsqd.tcp], max_delay=7200) as p:
        await p.publish(topic, b"later", delay=5400)
    stats = topic_stats(nsqd.http, topic)
    assert stats is not None and stats["message_count"] == 1


@pytest.mark.integration
@pytest.mark.anyio
async def test_consumer_runtime_calls_refuse_bad_values(
    classic_cluster: Any, anyio_backend: str
) -> None:
    nsqd = classic_cluster.nsqd[0]
    topic = unique("runtime")
    async with Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=3) as c:
        await wait_until(lambda: c.stats().connections, what="subscription")
        for bad in (NAN, 2.5, INF, True, "10"):
            with pytest.raises(InvalidType, match="max_in_flight must be an int"):
                c.set_max_in_flight(bad)
        assert c.max_in_flight == 3
        with pytest.raises(InvalidType, match="timeout must be a number"):
            await c.stop(timeout="1")  # type: ignore[arg-type]


@pytest.mark.integration
@pytest.mark.anyio
@pytest.mark.parametrize(
    ("delay", "error", "phrase"),
    [
        (NAN, InvalidArgument, "requeue delay must be a finite"),
        ("5", InvalidType, "requeue delay must be a number"),
        (True, InvalidType, "requeue delay must be a number"),
        (-1, InvalidArgument, "requeue delay must be >= 0"),
    ],
)
async def test_requeue_refuses_bad_delays(
    classic_cluster: Any, anyio_backend: str, delay: Any, error: type, phrase: str
) -> None:
    nsqd = classic_cluster.nsqd[0]
    topic = unique("requeue_bad")
    async with Producer([nsqd.tcp]) as p:
        await p.publish(topic, b"x")
    async with Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp]) as c:
        async for msg in c:
            with pytest.raises(error, match=phrase):
                msg.requeue(delay=delay)
            assert not msg.has_responded
            break
    stats = channel_stats(nsqd.http, topic, "c")
    assert stats is not None and stats["requeue_count"] == 0


@pytest.mark.integration
@pytest.mark.anyio
async def test_requeue_with_a_huge_delay_is_deferred_not_redelivered_now(
    classic_cluster: Any, anyio_backend: str
) -> None:
    """nsqd reads the REQ delay's digits into a wrapping uint64: ``requeue(delay=1e300)``
    came back at once. The client caps the delay (nsqd caps it at --max-req-timeout)."""
    nsqd = classic_cluster.nsqd[0]
    topic = unique("requeue_huge")
    create_channel(nsqd.http, topic, "c")
    async with Producer([nsqd.tcp]) as p:
        await p.publish(topic, b"x")
    async with Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp]) as c:
        async for msg in c:
            msg.requeue(delay=1e300)
            break

        def deferred() -> bool:
            stats = channel_stats(nsqd.http, topic, "c")
            return stats is not None and stats["requeue_count"] == 1

        await wait_until(deferred, what="the REQ")
        stats = channel_stats(nsqd.http, topic, "c")
        assert stats is not None
        assert stats["deferred_count"] == 1, stats


# -- the same rules as properties, without a server --------------------------------------------


@given(st.one_of(st.text(), st.booleans(), st.lists(st.integers()), st.none(), st.binary()))
def test_a_timeout_that_is_not_a_number_is_a_type_error(value: Any) -> None:
    with pytest.raises(InvalidType, match="timeout must be a number"):
        Producer(["127.0.0.1:4150"], timeout=value)


@given(st.one_of(st.floats(max_value=0), st.just(NAN), st.just(INF), st.integers(max_value=0)))
def test_a_timeout_that_is_not_a_positive_finite_number_is_refused(value: Any) -> None:
    with pytest.raises(InvalidArgument, match="timeout must be"):
        Producer(["127.0.0.1:4150"], timeout=value)


@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.text()))
def test_max_in_flight_takes_only_ints(value: Any) -> None:
    with pytest.raises(InvalidType, match="max_in_flight must be an int"):
        Consumer("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], max_in_flight=value)


@given(st.floats(min_value=3600, exclude_min=True, allow_infinity=False))
def test_config_delay_bounds_hold_for_any_float(value: float) -> None:
    from smartnsq._checks import check_delay

    with pytest.raises(InvalidArgument, match="max_delay"):
        check_delay(value, 3600)


def test_connection_config_checks_every_field() -> None:
    with pytest.raises(InvalidType, match="identify must be a mapping"):
        ConnectionConfig(identify_extra="x")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="JSON-serialisable"):
        ConnectionConfig(identify_extra={"k": object()})
    with pytest.raises(InvalidType, match="max_frame_size must be an int"):
        ConnectionConfig(max_frame_size=1.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidType, match="extend_support must be True or False"):
        ConnectionConfig(extend_support="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error", "phrase"),
    [
        ({"seeds": None}, InvalidType, "lookupd addresses must be a list"),
        ({"timeout": "5"}, InvalidType, "timeout must be a number"),
        ({"timeout": NAN}, InvalidArgument, "timeout must be a finite"),
        ({"listlookup_interval": 0}, InvalidArgument, "listlookup_interval must be > 0"),
        ({"min_refresh_interval": -1}, InvalidArgument, "min_refresh_interval must be >= 0"),
        ({"max_backoff": INF}, InvalidArgument, "max_backoff must be a finite"),
        ({"cache_ttl": True}, InvalidType, "cache_ttl must be a number"),
        ({"cache_jitter": 2}, InvalidArgument, "cache_jitter must be <= 1"),
    ],
)
def test_lookup_manager_checks_its_arguments(kwargs: Any, error: type, phrase: str) -> None:
    from smartnsq.lookup.manager import LookupManager

    args = {"seeds": ["127.0.0.1:4161"], **kwargs}
    with pytest.raises(error, match=phrase):
        LookupManager(args.pop("seeds"), **args)
