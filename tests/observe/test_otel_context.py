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
