"""W3C trace context across services in Youzan ext headers, against the real fork."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from compat.youzan import create_topic
from smartnsq import Consumer, Message, Producer
from smartnsq import sync as nsq_sync
from smartnsq.observe import otel
from tests.helpers import lookupds, unique, wait_for, wait_until

pytestmark = [pytest.mark.integration]

TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
PARENT = 0x00F067AA0BA902B7
TRACEPARENT = f"00-{TRACE:032x}-{PARENT:016x}-01"


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def ext_topic(cluster: Any) -> str:
    topic = unique("otelctx")
    create_topic(cluster, topic, partitions=1, replicas=1, ext=True, channel="ch")
    return topic


def check_continues(span: Any, trace_id: int, parent_id: int) -> None:
    assert span.kind is SpanKind.CONSUMER
    assert span.context.trace_id == trace_id
    assert span.parent is not None and span.parent.span_id == parent_id
    assert [(link.context.trace_id, link.context.span_id) for link in span.links] == [
        (trace_id, parent_id)
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_traceparent_set_by_another_client_is_continued(
    youzan_cluster, anyio_backend, spans
):
    # What Youzan's go-nsq sends when an application puts W3C context in the ext JSON itself.
    provider, exporter = spans
    topic = ext_topic(youzan_cluster)
    received: list[Message] = []
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        await producer.publish(topic, b"one", headers={"traceparent": TRACEPARENT, "k": "v"})
        await producer.publish(topic, b"two", headers={"traceparent": "garbage"})
    consumer = Consumer(
        topic, "ch", received.append, lookupd_http_addresses=lookupds(youzan_cluster)
    )
    otel.instrument(consumer, tracer_provider=provider)
    async with consumer:
        await wait_until(lambda: len(exporter.get_finished_spans()) == 2, 20, "2 spans")
    one, two = sorted(exporter.get_finished_spans(), key=lambda s: s.start_time)
    check_continues(one, TRACE, PARENT)
    assert two.parent is None and not two.links  # unreadable context: a trace of its own
    assert received[0].headers["k"] == "v"


def test_the_blocking_consumer_continues_it_too(youzan_cluster, spans):
    provider, exporter = spans
    topic = ext_topic(youzan_cluster)
    with nsq_sync.Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        producer.publish(topic, b"one", headers={"traceparent": TRACEPARENT})
    consumer = nsq_sync.Consumer(
        topic, "ch", lambda m: None, lookupd_http_addresses=lookupds(youzan_cluster)
    )
    otel.instrument(consumer, tracer_provider=provider)
    with consumer:
        wait_for(lambda: exporter.get_finished_spans(), 20, "the span")
    check_continues(exporter.get_finished_spans()[0], TRACE, PARENT)


def by_kind(exporter: InMemorySpanExporter, kind: SpanKind) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.kind is kind]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_one_trace_from_publish_to_handler(youzan_cluster, anyio_backend, spans):
    provider, exporter = spans
    topic = ext_topic(youzan_cluster)
    received: list[Message] = []
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        otel.instrument(producer, tracer_provider=provider)
        assert await producer.is_ext_topic(topic)
        await producer.publish(topic, b"single")  # no headers given: the topic is ext
        await producer.publish_many(topic, [b"m1", b"m2"])
        await producer.publish_many(topic, [b"h1", b"h2"], headers=[{"k": "1"}, None])
    consumer = Consumer(
        topic, "ch", received.append, lookupd_http_addresses=lookupds(youzan_cluster)
    )
    otel.instrument(consumer, tracer_provider=provider)
    async with consumer:
        await wait_until(lambda: len(by_kind(exporter, SpanKind.CONSUMER)) == 5, 20, "5 spans")
    sends = sorted(by_kind(exporter, SpanKind.PRODUCER), key=lambda s: s.start_time)
    publish_of = {b"single": sends[0], b"m1": sends[1], b"m2": sends[1]}
    publish_of |= {b"h1": sends[2], b"h2": sends[2]}
    handled = {m.body: m for m in received}
    for span in by_kind(exporter, SpanKind.CONSUMER):
        mid = dict(span.attributes or {})["messaging.message.id"]
        (body,) = [b for b, m in handled.items() if str(m.internal_id) == mid]
        sent = publish_of[body]
        check_continues(span, sent.context.trace_id, sent.context.span_id)
    assert handled[b"h1"].headers["k"] == "1"
    assert "traceparent" in handled[b"h2"].headers


def test_blocking_producer_carries_context_too(youzan_cluster, spans):
    provider, exporter = spans
    topic = ext_topic(youzan_cluster)
    with nsq_sync.Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        otel.instrument(producer, tracer_provider=provider)
        producer.publish(topic, b"one")
        producer.publish_many(topic, [b"two", b"three"])
    consumer = nsq_sync.Consumer(
        topic, "ch", lambda m: None, lookupd_http_addresses=lookupds(youzan_cluster)
    )
    otel.instrument(consumer, tracer_provider=provider)
    with consumer:
        wait_for(lambda: len(by_kind(exporter, SpanKind.CONSUMER)) == 3, 20, "3 spans")
    sends = {s.context.span_id: s for s in by_kind(exporter, SpanKind.PRODUCER)}
    for span in by_kind(exporter, SpanKind.CONSUMER):
        assert span.parent is not None and span.parent.span_id in sends
        assert span.context.trace_id == sends[span.parent.span_id].context.trace_id


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_plain_youzan_topic_and_classic_nsqd_get_no_headers(
    youzan_cluster, classic_cluster, anyio_backend, spans
):
    provider, exporter = spans
    plain = unique("otelplain")
    create_topic(youzan_cluster, plain, partitions=1, replicas=1, channel="ch")
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster)) as producer:
        otel.instrument(producer, tracer_provider=provider)
        assert not await producer.is_ext_topic(plain)
        await producer.publish(plain, b"x")  # would fail with E_EXT_NOT_SUPPORT if headed
    async with Producer([classic_cluster.nsqd[0].tcp]) as producer:
        otel.instrument(producer, tracer_provider=provider)
        assert not await producer.is_ext_topic("anything")
        await producer.publish(unique("classic"), b"x")
        await producer.publish_many(unique("classic"), [b"x", b"y"])
    assert len(by_kind(exporter, SpanKind.PRODUCER)) == 3
