"""Prometheus metrics and OpenTelemetry spans, read back after real publishes and consumes."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry

from compat.youzan import create_topic
from smartnsq import Consumer, Message, Producer
from smartnsq import sync as nsq_sync
from smartnsq.errors import InvalidArgument, InvalidType, NSQError
from smartnsq.observe import otel, prometheus
from tests.helpers import create_channel, lookupds, unique, wait_for, wait_until

pytestmark = [pytest.mark.integration]


def test_importing_smartnsq_imports_neither_prometheus_nor_opentelemetry():
    code = (
        "import sys, smartnsq, smartnsq.sync, smartnsq.observe\n"
        "print(sorted(m for m in sys.modules if m.startswith(('prometheus', 'opentelemetry'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- Prometheus


@pytest.mark.anyio
async def test_prometheus_collector_reads_stats_at_scrape(classic_cluster, anyio_backend):
    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("prom"), "c"
    create_channel(nsqd.http, topic, ch)
    registry = CollectorRegistry()
    got: list[bytes] = []
    async with (
        Producer([nsqd.tcp]) as producer,
        Consumer(topic, ch, got.append, nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=10) as c,
    ):
        prometheus.register(producer, registry, labels={"app": "shop"})
        prometheus.register(c, registry)
        value = registry.get_sample_value
        node = {"app": "shop", "nsqd": nsqd.tcp}
        assert value("nsq_producer_published_messages_total", node) == 0
        await producer.publish(topic, b"one")
        await producer.publish_many(topic, [b"m%d" % i for i in range(200)])
        assert value("nsq_producer_published_messages_total", node) == 201
        assert value("nsq_producer_requests_total", node) == 2
        assert value("nsq_producer_request_errors_total", node) == 0
        assert value("nsq_producer_connections", node) == 1
        assert value("nsq_producer_nsqd_down", node) == 0
        assert value("nsq_producer_failed_messages_total", {"app": "shop"}) == 0
        assert value("nsq_producer_retries_total", {"app": "shop"}) == 0

        # Empty labels are absent labels to Prometheus: the consumer has app="".
        mine = {"topic": topic, "channel": ch, "app": ""}
        conn = {**mine, "nsqd": nsqd.tcp, "partition": ""}
        await wait_until(lambda: len(got) == 201, 10, "every message")
        await wait_until(lambda: c.stats().in_flight == 0, 10, "every message answered")
        assert value("nsq_consumer_received_messages_total", mine) == 201
        assert value("nsq_consumer_finished_messages_total", mine) == 201
        assert value("nsq_consumer_requeued_messages_total", mine) == 0
        assert value("nsq_consumer_refused_answers_total", mine) == 0  # stats().refused
        assert value("nsq_consumer_connections", mine) == 1
        assert value("nsq_consumer_in_flight", mine) == 0
        assert value("nsq_consumer_backoff_level", mine) == 0
        assert value("nsq_consumer_connection_received_messages_total", conn) == 201
        assert value("nsq_consumer_connection_rdy", conn) == 10
        assert value("nsq_consumer_connection_in_flight", conn) == 0

        prometheus.unregister(c, registry)
        assert value("nsq_consumer_received_messages_total", mine) is None
        assert value("nsq_producer_requests_total", node) == 2


def test_prometheus_sync_clients_and_input_checks(classic_cluster):
    nsqd = classic_cluster.nsqd[0]
    topic = unique("promsync")
    registry = CollectorRegistry()
    with nsq_sync.Producer([nsqd.tcp]) as producer:
        prometheus.register(producer, registry)
        producer.publish_many(topic, [b"a", b"b", b"c"])
        assert (
            registry.get_sample_value("nsq_producer_published_messages_total", {"nsqd": nsqd.tcp})
            == 3
        )
        with pytest.raises(InvalidArgument, match="distinct labels"):
            prometheus.register(nsq_sync.Producer([nsqd.tcp]), registry)
        with pytest.raises(InvalidArgument, match="valid Prometheus label"):
            prometheus.register(producer, registry, labels={"bad-name": "x"})
        with pytest.raises(InvalidArgument, match="set by smartnsq"):
            prometheus.register(producer, registry, labels={"nsqd": "x"})
        with pytest.raises(InvalidType, match="str to str"):
            prometheus.register(producer, registry, labels={"app": 1})  # type: ignore[dict-item]
        with pytest.raises(InvalidType, match="Producer or Consumer"):
            prometheus.register(object(), registry)  # type: ignore[arg-type]
        with pytest.raises(InvalidType, match="CollectorRegistry"):
            prometheus.register(producer, registry={})  # type: ignore[arg-type]
    consumer = nsq_sync.Consumer(topic, "c", lambda m: None, nsqd_tcp_addresses=[nsqd.tcp])
    prometheus.register(consumer, registry)
    labels = {"topic": topic, "channel": "c"}
    assert registry.get_sample_value("nsq_consumer_received_messages_total", labels) is None
    with consumer:
        wait_for(
            lambda: registry.get_sample_value("nsq_consumer_finished_messages_total", labels) == 3,
            10,
            "three messages finished, as the metrics say",
        )


# --------------------------------------------------------------------------- OpenTelemetry


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def attributes(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


@pytest.mark.anyio
async def test_otel_spans_for_publish_and_handle(classic_cluster, anyio_backend, spans):
    provider, exporter = spans
    nsqd = classic_cluster.nsqd[0]
    topic, ch = unique("otel"), "c"
    create_channel(nsqd.http, topic, ch)
    ids: dict[bytes, str] = {}

    async def handle(message: Message) -> bool:
        ids[message.body] = message.id.decode()
        if message.body == b"bad" and message.attempts == 1:
            raise ValueError("first try fails")
        return not (message.body == b"no" and message.attempts == 1)  # False: requeue

    async with Producer([nsqd.tcp]) as producer:
        otel.instrument(producer, tracer_provider=provider)
        with pytest.raises(InvalidArgument, match="already"):
            otel.instrument(producer, tracer_provider=provider)
        await producer.publish(topic, b"one")
        await producer.publish_many(topic, [b"bad", b"no"])
        consumer = Consumer(
            topic, ch, handle, nsqd_tcp_addresses=[nsqd.tcp], requeue_delay=0, backoff=False
        )
        otel.instrument(consumer, tracer_provider=provider)
        async with consumer:
            with pytest.raises(NSQError, match="before starting"):
                otel.instrument(consumer, tracer_provider=provider)
            with pytest.raises(NSQError, match="before starting"):
                otel.uninstrument(consumer)

            def processed() -> list[Any]:
                found = exporter.get_finished_spans()
                return [s for s in found if s.kind == SpanKind.CONSUMER]

            await wait_until(lambda: len(processed()) == 5, 10, "5 handler spans")
            otel.uninstrument(producer)
            await producer.publish(topic, b"untraced")
    finished = exporter.get_finished_spans()
    sent = [s for s in finished if s.kind == SpanKind.PRODUCER]
    assert [s.name for s in sent] == [f"publish {topic}"] * 2
    common = {
        "messaging.system": "nsq",
        "messaging.destination.name": topic,
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
    }
    assert attributes(sent[0]) == {**common, "messaging.message.body.size": 3}
    assert attributes(sent[1]) == {**common, "messaging.batch.message_count": 2}
    assert all(s.status.status_code == StatusCode.UNSET for s in sent)

    handled = [s for s in finished if s.kind == SpanKind.CONSUMER]
    by_body: dict[str, list[Any]] = {}
    for span in handled:
        assert span.name == f"process {topic}"
        attrs = attributes(span)
        assert attrs["messaging.system"] == "nsq"
        assert attrs["messaging.destination.name"] == topic
        assert attrs["messaging.consumer.group.name"] == ch
        assert attrs["messaging.operation.type"] == "process"
        by_body.setdefault(attrs["messaging.message.id"], []).append(span)
    assert set(by_body) == set(ids.values())
    bad = by_body[ids[b"bad"]]
    assert [s.status.status_code for s in bad] == [StatusCode.ERROR, StatusCode.UNSET]
    assert [attributes(s)["messaging.nsq.attempts"] for s in bad] == [1, 2]
    assert bad[0].events[0].name == "exception"
    no = by_body[ids[b"no"]]
    assert [attributes(s).get("messaging.nsq.requeued") for s in no] == [True, None]
    assert "messaging.nsq.requeued" not in attributes(by_body[ids[b"one"]][0])


def test_otel_sync_clients_and_input_checks(classic_cluster, spans):
    provider, exporter = spans
    nsqd = classic_cluster.nsqd[0]
    topic = unique("otelsync")
    with nsq_sync.Producer([nsqd.tcp]) as producer:
        otel.instrument(producer, tracer_provider=provider)
        producer.publish(topic, b"hello")
    got: list[str] = []
    consumer = nsq_sync.Consumer(
        topic, "c", lambda m: got.append(m.id.decode()), nsqd_tcp_addresses=[nsqd.tcp]
    )
    otel.instrument(consumer, tracer_provider=provider)
    with consumer:
        wait_for(lambda: got, 10, "the message")
    (sent,) = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.PRODUCER]
    (handled,) = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.CONSUMER]
    assert attributes(sent)["messaging.destination.name"] == topic
    assert attributes(handled)["messaging.message.id"] == got[0]
    with pytest.raises(InvalidArgument, match="no handler"):
        otel.instrument(Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp]))
    with pytest.raises(InvalidType, match="Producer or Consumer"):
        otel.instrument(object())  # type: ignore[arg-type]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_otel_spans_carry_youzan_ids(youzan_cluster, anyio_backend, spans):
    provider, exporter = spans
    topic = unique("oteltrc")
    create_topic(youzan_cluster, topic, partitions=1, replicas=1, channel="ch")
    received: list[Message] = []
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        otel.instrument(producer, tracer_provider=provider)
        result = await producer.publish(topic, b"one", trace_id=2**63 + 5)
        consumer = Consumer(
            topic, "ch", received.append, lookupd_http_addresses=lookupds(youzan_cluster)
        )
        otel.instrument(consumer, tracer_provider=provider)
        async with consumer:
            await wait_until(lambda: received, 20, "the message")
            await wait_until(lambda: len(exporter.get_finished_spans()) == 2, 10, "2 spans")
            ((key, node),) = consumer.stats().nodes.items()  # one connection per partition
            assert (key, node.partition, node.received) == (f"{node.address}/0", 0, 1)
            assert producer.stats().nodes[node.address].published == 1
    assert result is not None
    sent, handled = exporter.get_finished_spans()
    for span in sent, handled:
        attrs = attributes(span)
        assert attrs[otel.TRACE_ID] == str(2**63 + 5)  # beyond a signed 64-bit int
        assert attrs["messaging.message.id"] == str(result.internal_id)
        assert attrs["messaging.destination.partition.id"] == "0"
    assert received[0].internal_id == result.internal_id
