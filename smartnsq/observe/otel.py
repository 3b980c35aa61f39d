"""OpenTelemetry spans for publishes and handlers (``pip install 'smartnsq[otel]'``).

::

    from smartnsq.observe import otel

    otel.instrument(producer)    # a PRODUCER span per publish() / publish_many() call
    otel.instrument(consumer)    # a CONSUMER span per handler call; before starting it

Nothing is traced unless :func:`instrument` is called: it wraps that one client's publish
methods (or its handler), so uninstrumented clients run exactly the code they did before.

Attributes follow OpenTelemetry's messaging conventions: ``messaging.system`` ``"nsq"``,
``messaging.destination.name`` (topic), ``messaging.consumer.group.name`` (channel),
``messaging.operation.type`` (``send`` / ``process``), ``messaging.operation.name``
(``publish`` / ``process``), ``messaging.message.id``, ``messaging.message.body.size``,
``messaging.batch.message_count``, ``messaging.destination.partition.id`` (Youzan
partitions). NSQ-specific ones: ``messaging.nsq.trace_id`` (the Youzan trace id, a decimal
string: it may not fit OpenTelemetry's signed 64-bit integers), ``messaging.nsq.attempts``
and ``messaging.nsq.requeued`` (the handler returned ``False``). A handler's exception is
recorded on its span, which is then marked as an error.

Trace context travels in Youzan ext headers (JSON). An instrumented producer injects the
publish span's context (W3C ``traceparent``, and ``tracestate`` when set) into the header of
every message it sends to an ext topic: one published with ``headers=`` or a tag, or one that
lookupd's topic metadata marks as ext (:meth:`smartnsq.Producer.is_ext_topic`); deferred
publishes and ``trace_ids=`` batches carry no headers. A handler's span continues the trace of
the message's header: it is the publish span's child,
with a link to it as well, as OpenTelemetry's messaging conventions have it. The header is read
through OpenTelemetry's propagator API, so a propagator the application configured is the one
used, and a header set by any other client (Youzan's go-nsq, the Java SDK) counts alike.
Classic nsqd has no message headers: there a handler's span starts a trace of its own.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sized
from contextlib import AbstractContextManager
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Tracer, TracerProvider

from smartnsq._version import __version__
from smartnsq.consumer import Consumer, is_async_handler
from smartnsq.consumer.message import Message
from smartnsq.errors import InvalidArgument, InvalidType, NSQError, ProtocolError
from smartnsq.producer import Producer
from smartnsq.protocol.message import PublishResult
from smartnsq.sync.consumer import Consumer as SyncConsumer
from smartnsq.sync.producer import Producer as SyncProducer

__all__ = ["TRACE_ID", "instrument", "uninstrument"]

#: The attribute that carries the Youzan trace id (decimal string).
TRACE_ID = "messaging.nsq.trace_id"

_SCOPE = "smartnsq"
_WRAPPED = ("publish", "publish_many")


def instrument(
    client: Producer | SyncProducer | Consumer | SyncConsumer,
    *,
    tracer_provider: TracerProvider | None = None,
) -> None:
    """Trace a producer's publishes or a consumer's handler calls with OpenTelemetry spans.

    Args:
        client: A :class:`smartnsq.Producer` or :class:`smartnsq.sync.Producer` (any time),
            or a :class:`smartnsq.Consumer` or :class:`smartnsq.sync.Consumer` with a
            handler, before it is started.
        tracer_provider: Where spans go; OpenTelemetry's global provider if omitted.

    Raises:
        InvalidType: ``client`` is none of those.
        InvalidArgument: The consumer has no handler (pulled messages are the caller's to
            trace), or it is instrumented already.
        NSQError: The consumer is already started.
    """
    tracer = trace.get_tracer(_SCOPE, __version__, tracer_provider=tracer_provider)
    if isinstance(client, Producer | SyncProducer):
        if "publish" in vars(client):
            raise InvalidArgument("this Producer is instrumented already")
        if isinstance(client, Producer):
            _instrument_async_producer(client, tracer)
        else:
            _instrument_sync_producer(client, tracer)
        return
    if not isinstance(client, Consumer | SyncConsumer):
        raise InvalidType(
            "instrument takes a smartnsq Producer or Consumer (async or sync), "
            f"not {type(client).__name__}"
        )
    if client.started:
        raise NSQError("instrument a Consumer before starting it")
    handler = client.handler
    if handler is None:
        raise InvalidArgument(
            "this Consumer has no handler: trace the messages you pull in your own spans"
        )
    if getattr(handler, "_smartnsq_traced", False):
        raise InvalidArgument("this Consumer is instrumented already")
    client.handler = _traced_handler(handler, tracer, client.topic, client.channel)


def uninstrument(client: Producer | SyncProducer | Consumer | SyncConsumer) -> None:
    """Undo :func:`instrument`; nothing happens if ``client`` was not instrumented.

    Args:
        client: The producer, or the consumer (not started yet).

    Raises:
        NSQError: The consumer is already started.
    """
    if isinstance(client, Producer | SyncProducer):
        for name in _WRAPPED:
            vars(client).pop(name, None)
        return
    if isinstance(client, Consumer | SyncConsumer):
        if client.started:
            raise NSQError("uninstrument a Consumer before starting it")
        original = getattr(client.handler, "__wrapped__", None)
        if original is not None and getattr(client.handler, "_smartnsq_traced", False):
            client.handler = original


# -- producers -----------------------------------------------------------------------------------


def _publish_span(
    tracer: Tracer,
    topic: str,
    kwargs: dict[str, Any],
    *,
    body: object = None,
    bodies: object = None,
) -> AbstractContextManager[Span]:
    """The PRODUCER span of one publish (``body``) or publish_many (``bodies``) call, for
    the async and the blocking producer alike."""
    attributes: dict[str, Any] = {
        "messaging.system": "nsq",
        "messaging.destination.name": topic,
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
    }
    if bodies is not None:
        count = _batch_size(bodies)
        if count is not None:
            attributes["messaging.batch.message_count"] = count
    elif isinstance(body, Sized):
        attributes["messaging.message.body.size"] = len(body)
    partition = kwargs.get("partition")
    if isinstance(partition, int):
        attributes["messaging.destination.partition.id"] = str(partition)
    trace_id = kwargs.get("trace_id")
    if isinstance(trace_id, int):
        attributes[TRACE_ID] = str(trace_id)
    return tracer.start_as_current_span(
        f"publish {topic}", kind=SpanKind.PRODUCER, attributes=attributes
    )


def _on_result(span: Span, result: PublishResult | list[PublishResult] | None) -> None:
    """What a traced (Youzan) publish answered: the message's id, partition and trace id."""
    if isinstance(result, list):
        if len(result) != 1:
            return
        result = result[0]
    if result is None:
        return
    span.set_attribute("messaging.message.id", str(result.internal_id))
    span.set_attribute("messaging.destination.partition.id", str(result.partition))
    if result.trace_id:
        span.set_attribute(TRACE_ID, str(result.trace_id))


def _batch_size(bodies: object) -> int | None:
    if isinstance(bodies, Sized) and not isinstance(bodies, bytes | bytearray | str):
        return len(bodies)
    return None  # an iterator: not consumed here


def _ext_wanted(kwargs: dict[str, Any]) -> bool | None:
    """Whether a publish goes out with ext headers (then trace context rides along): True,
    False (a deferred or traced-batch publish has no headers), or None: ask the producer
    whether the topic is an ext topic."""
    if kwargs.get("delay") or kwargs.get("trace_ids") is not None:
        return False
    if any(kwargs.get(k) is not None for k in ("headers", "tag", "tags")):
        return True
    return None


def _with_context(headers: Any, many: bool) -> Any:
    """``headers`` with the current (publish span's) context injected, through the
    application's propagator; for publish_many, into every message's header."""
    if many and headers is not None and not isinstance(headers, Mapping):
        return [_with_context(h, False) for h in headers]
    carrier: dict[str, Any] = dict(headers or {})
    propagate.inject(carrier)
    return carrier


def _instrument_async_producer(producer: Producer, tracer: Tracer) -> None:
    publish, publish_many = producer.publish, producer.publish_many

    async def carry(topic: str, kwargs: dict[str, Any], many: bool) -> None:
        wanted = _ext_wanted(kwargs)
        if wanted is None:
            try:
                wanted = await producer.is_ext_topic(topic)
            except NSQError:  # the publish says what is wrong
                wanted = False
        if wanted:
            kwargs["headers"] = _with_context(kwargs.get("headers"), many)

    @functools.wraps(publish)
    async def traced_publish(topic: str, body: bytes, **kwargs: Any) -> PublishResult | None:
        with _publish_span(tracer, topic, kwargs, body=body) as span:
            await carry(topic, kwargs, False)
            result = await publish(topic, body, **kwargs)
            _on_result(span, result)
            return result

    @functools.wraps(publish_many)
    async def traced_publish_many(
        topic: str, bodies: Any, **kwargs: Any
    ) -> list[PublishResult] | None:
        with _publish_span(tracer, topic, kwargs, bodies=bodies) as span:
            await carry(topic, kwargs, True)
            results = await publish_many(topic, bodies, **kwargs)
            _on_result(span, results)
            return results

    # Instance attributes shadow the methods for this producer only.
    vars(producer).update(publish=traced_publish, publish_many=traced_publish_many)


def _instrument_sync_producer(producer: SyncProducer, tracer: Tracer) -> None:
    publish, publish_many = producer.publish, producer.publish_many

    def carry(topic: str, kwargs: dict[str, Any], many: bool) -> None:
        wanted = _ext_wanted(kwargs)
        if wanted is None:
            try:
                wanted = producer.is_ext_topic(topic)
            except NSQError:
                wanted = False
        if wanted:
            kwargs["headers"] = _with_context(kwargs.get("headers"), many)

    @functools.wraps(publish)
    def traced_publish(topic: str, body: bytes, **kwargs: Any) -> PublishResult | None:
        with _publish_span(tracer, topic, kwargs, body=body) as span:
            carry(topic, kwargs, False)
            result = publish(topic, body, **kwargs)
            _on_result(span, result)
            return result

    @functools.wraps(publish_many)
    def traced_publish_many(topic: str, bodies: Any, **kwargs: Any) -> list[PublishResult] | None:
        with _publish_span(tracer, topic, kwargs, bodies=bodies) as span:
            carry(topic, kwargs, True)
            results = publish_many(topic, bodies, **kwargs)
            _on_result(span, results)
            return results

    vars(producer).update(publish=traced_publish, publish_many=traced_publish_many)


# -- consumers -----------------------------------------------------------------------------------


def _process_attributes(msg: Message, topic: str, channel: str) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.system": "nsq",
        "messaging.destination.name": topic,
        "messaging.consumer.group.name": channel,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.body.size": len(msg.body),
        "messaging.nsq.attempts": msg.attempts,
    }
    # Youzan deliveries always have a partition (lookupd's, or their internal id's) and an
    # internal id and a trace id for an id; classic ones have neither.
    if msg.partition is not None:
        attributes["messaging.message.id"] = str(msg.internal_id)
        attributes["messaging.destination.partition.id"] = str(msg.partition)
        if msg.trace_id:
            attributes[TRACE_ID] = str(msg.trace_id)
    else:
        mid = msg.id
        attributes["messaging.message.id"] = mid.decode() if mid.isascii() else mid.hex()
    return attributes


def _upstream(msg: Message) -> tuple[Context | None, list[Link] | None]:
    """The trace context a message's ext header carries (its publish span), if any."""
    if not msg.ext:
        return None, None
    try:
        headers = msg.headers
    except ProtocolError:
        return None, None
    carrier = {k: v for k, v in headers.items() if isinstance(v, str)}
    context = propagate.extract(carrier)
    parent = trace.get_current_span(context).get_span_context()
    if not parent.is_valid:
        return None, None
    return context, [Link(parent)]


def _outcome(span: Span, value: object) -> None:
    if value is False:
        span.set_attribute("messaging.nsq.requeued", True)


def _traced_handler(
    handler: Callable[[Message], Any], tracer: Tracer, topic: str, channel: str
) -> Callable[[Message], Any]:
    name = f"process {topic}"
    if is_async_handler(handler):

        @functools.wraps(handler)
        async def traced_async(msg: Message) -> Any:
            attributes = _process_attributes(msg, topic, channel)
            context, links = _upstream(msg)
            with tracer.start_as_current_span(
                name, context, SpanKind.CONSUMER, attributes, links
            ) as span:
                value = await handler(msg)
                _outcome(span, value)
                return value

        traced: Callable[[Message], Any] = traced_async
    else:

        @functools.wraps(handler)
        def traced_sync(msg: Message) -> Any:
            attributes = _process_attributes(msg, topic, channel)
            context, links = _upstream(msg)
            with tracer.start_as_current_span(
                name, context, SpanKind.CONSUMER, attributes, links
            ) as span:
                value = handler(msg)
                if inspect.isawaitable(value):  # forwarded to an async function: its result
                    return _finish_later(span, value)
                _outcome(span, value)
                return value

        traced = traced_sync
    traced._smartnsq_traced = True  # type: ignore[attr-defined]
    return traced


async def _finish_later(span: Span, awaitable: Awaitable[Any]) -> Any:
    # The sync handler returned an awaitable; the consumer awaits it on its loop. The span
    # was ended with the call; the outcome is still recorded when known.
    value = await awaitable
    if span.is_recording():
        _outcome(span, value)
    return value
