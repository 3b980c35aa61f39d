"""What a publish call becomes, sans-IO.

:class:`Plan` checks a ``publish`` or ``publish_many`` call before anything is sent (raising a
typed error that says what to fix) and turns it into bytes to send as they are, or
:class:`Request` objects built per partition once the route is known; it reads nsqd's answer
to a traced one. :class:`BatchRun` keeps a ``publish_many``'s account while its batches go out.
The IO (:mod:`smartnsq.producer.io`) sends what it plans.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from smartnsq._checks import check_delay, check_timeout
from smartnsq.errors import (
    InvalidArgument,
    InvalidType,
    MessageTooLarge,
    NoNsqdAvailable,
    NSQError,
    NSQTimeout,
    PartialPublish,
)
from smartnsq.lookup.model import TopicLayout
from smartnsq.ordered.sharding import ShardingKey, check_key
from smartnsq.producer.settings import Settings
from smartnsq.protocol import commands
from smartnsq.protocol.compress import COMPRESS_KEY, SIZE_KEY, compress_body
from smartnsq.protocol.message import PublishResult, decode_publish_response
from smartnsq.protocol.names import validate_topic
from smartnsq.protocol.tags import TAG_KEY, check_tag
from smartnsq.trace import TraceSwitch, emit

_pack_u32 = struct.Struct(">I").pack

Build = Callable[[int | None], bytes]


def check_body(body: object) -> bytes:
    """``body`` as bytes: any bytes-like object (bytearray, memoryview, ...) gives its bytes."""
    if type(body) is not bytes:
        if isinstance(body, str):
            raise InvalidType("message body must be bytes, not str: encode it first")
        try:
            body = memoryview(body).tobytes()  # type: ignore[arg-type]
        except TypeError:
            raise InvalidType(f"message body must be bytes, not {type(body).__name__}") from None
    if not body:
        raise InvalidArgument("message body must not be empty (nsqd rejects empty messages)")
    return body


def sizes(lens: list[int]) -> tuple[int | None, int, int, int]:
    """(the size every body has, or None; shortest; longest; total) of non-empty ``lens``."""
    size = lens[0]
    if lens.count(size) == len(lens):  # same-size bodies (common in bulk): no more passes
        return size, size, size, size * len(lens)
    return None, min(lens), max(lens), sum(lens)


def new_trace_id() -> int:
    return random.getrandbits(63) or 1


def check_trace_id(trace_id: object) -> None:
    if not isinstance(trace_id, int) or isinstance(trace_id, bool) or not 0 <= trace_id < 2**64:
        raise InvalidArgument(f"trace_id must be an int in [0, 2**64), not {trace_id!r}")


def mpub_count(topic: str, data: bytes) -> int:
    """How many messages an MPUB for ``topic`` carries (its header says)."""
    start = 10 + len(topic)  # "MPUB " + topic + "\n" + body size
    return int.from_bytes(data[start : start + 4])


def _spans(sizes: list[int], max_body_size: int) -> list[tuple[int, int]]:
    """Split messages of these encoded ``sizes`` into batches whose MPUB body (a 4-byte
    count, then the messages) fits ``max_body_size``; (start, end) of each."""
    spans = []
    start, size = 0, 4
    for i, n in enumerate(sizes):
        if i > start and size + n > max_body_size:
            spans.append((start, i))
            start, size = i, 4
        size += n
    spans.append((start, len(sizes)))
    return spans


ManyHeaders = Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None


def _many_headers(headers: ManyHeaders, count: int) -> list[Mapping[str, Any] | None] | None:
    """publish_many's ``headers``: one mapping for every message, or one (or None) each."""
    if headers is None or isinstance(headers, Mapping):
        return None if headers is None else [headers] * count
    if isinstance(headers, str | bytes) or not isinstance(headers, Iterable):
        raise InvalidType("headers must be a mapping, or a list with one mapping (or None) each")
    each = list(headers)
    if len(each) != count:
        raise InvalidArgument(
            f"got {count} messages but {len(each)} headers; give one per message (None for "
            "none), or one mapping for all"
        )
    return each


def _ext_headers(
    headers: Mapping[str, Any] | None,
    tag: str | None,
    packed: tuple[bytes, dict[str, str]] | None,
) -> dict[str, Any]:
    """The ext header of one message: the caller's, its tag, its compression."""
    if headers is None:
        ext: dict[str, Any] = {}
    elif not isinstance(headers, Mapping):
        raise InvalidType("headers must be a mapping of JSON-serialisable values")
    else:
        ext = dict(headers)
        if COMPRESS_KEY in ext or SIZE_KEY in ext:
            # A consumed message's body is already decompressed: forwarding these with it
            # would make every consumer fail to decompress it.
            raise InvalidArgument(
                f"headers must not contain {COMPRESS_KEY!r} or {SIZE_KEY!r}: the producer "
                "sets them when it compresses (compress_topics=...); drop them"
            )
    if tag is not None:
        ext[TAG_KEY] = tag
    if packed is not None:
        ext.update(packed[1])
    return ext


def emit_publish(
    topic: str, partition: int | None, address: str, result: PublishResult, count: int = 1
) -> None:
    emit(
        "publish",
        topic=topic,
        partition=result.partition if partition is None else partition,
        nsqd=address,
        internal_id=result.internal_id,
        trace_id=result.trace_id,
        offset=result.offset,
        size=result.size,
        count=count,
    )


@dataclass(frozen=True, slots=True)
class Request:
    """One command of a publish call: built per partition once the route is known."""

    build: Build
    deferred: bool = False
    traced: bool = False  # the answer carries a PublishResult
    count: int = 1  # messages in it
    ext: bool = False  # PUB_EXT / MPUB_EXT: Youzan only


@dataclass(frozen=True, slots=True)
class Batches:
    """A publish_many call as requests, in order; ``routed`` when they need a route."""

    requests: list[Request]
    total: int
    routed: bool
    traced: bool  # MPUB_TRACE: one PublishResult per batch


class Plan:
    """Checks publish calls and plans their commands, from the producer's settings."""

    def __init__(self, settings: Settings) -> None:
        self.max_message_size = settings.max_message_size
        self.max_body_size = settings.max_body_size
        self.max_delay = settings.max_delay
        self.compress_codec = settings.compress_codec
        self.compress_min_size = settings.compress_min_size
        self.trace = TraceSwitch()
        self._lookupds = bool(settings.lookupds)
        self._sharder = settings.sharder
        # Empty when off: the plain publish path then pays one truth test.
        self._compress_topics = settings.compress_topics
        self._topics: set[str] = set()  # names checked already
        self._pub_lines: dict[str, bytes] = {}

    def check_topic(self, topic: str) -> None:
        if type(topic) is not str or topic not in self._topics:
            self._topics.add(validate_topic(topic))

    def _plain_pub(self, topic: str, body: bytes) -> bytes:
        """The PUB command, with the topic's command line built once."""
        line = self._pub_lines.get(topic)
        if line is None:
            line = self._pub_lines[topic] = b"PUB %s\n" % topic.encode()
        return b"".join((line, _pack_u32(len(body)), body))

    def publish(
        self,
        topic: str,
        body: bytes,
        delay: float | None,
        partition: int | None,
        sharding_key: ShardingKey | None,
        trace_id: int | None,
        headers: Mapping[str, Any] | None,
        timeout: float | None,
        tag: str | None = None,
    ) -> Request | bytes:
        """Check one publish; bytes to send as they are (no routing needed), or a request."""
        self.check_topic(topic)
        if timeout is not None:
            check_timeout("timeout", timeout)
        body = check_body(body)
        packed = None
        if self._compress_topics and delay is None:
            packed = self._compress(topic, body)
        size = len(body) if packed is None else len(packed[0])
        if size > self.max_message_size:
            raise MessageTooLarge(
                f"message of {size} bytes exceeds max_message_size "
                f"({self.max_message_size}); nsqd would reject it"
            )
        if (
            delay is None
            and partition is None
            and sharding_key is None
            and trace_id is None
            and headers is None
            and tag is None
            and packed is None
            and not self._lookupds
            and not (self.trace.active and self.trace.enabled(topic))
        ):
            return self._plain_pub(topic, body)
        self.check_routing(partition, sharding_key)
        if tag is not None:
            check_tag("tag", tag)
        if delay is not None:
            check_delay(delay, self.max_delay)
            if trace_id is not None or headers is not None or tag is not None:
                raise InvalidArgument("delay cannot be combined with trace_id, headers or tag")
            delay_ms = round(delay * 1000)
            return Request(lambda p: commands.dpub(topic, delay_ms, body), deferred=True)
        if trace_id is None and self.trace.enabled(topic):
            trace_id = new_trace_id()
        if trace_id is not None:
            check_trace_id(trace_id)
        if headers is not None or tag is not None or packed is not None:
            ext = _ext_headers(headers, tag, packed)
            if packed is not None:
                body = packed[0]
            if trace_id is not None:
                ext["##trace_id"] = str(trace_id)
            return Request(lambda p: commands.pub_ext(topic, body, ext, p), traced=True, ext=True)
        if trace_id is not None:
            tid = trace_id
            return Request(lambda p: commands.pub_trace(topic, body, tid, p), traced=True)
        return Request(lambda p: commands.pub(topic, body, p), traced=True)

    def _compress(self, topic: str, body: bytes) -> tuple[bytes, dict[str, str]] | None:
        """The compressed body and its headers, when the topic and the size call for it."""
        if len(body) < self.compress_min_size or topic not in self._compress_topics:
            return None
        return compress_body(self.compress_codec, body)

    def many(
        self,
        topic: str,
        bodies: Iterable[bytes],
        partition: int | None,
        sharding_key: ShardingKey | None,
        trace_ids: Sequence[int] | None,
        timeout: float | None,
        tags: Sequence[str | None] | None = None,
        headers: ManyHeaders = None,
    ) -> Batches | bytes:
        """Check a publish_many; one MPUB to send as it is, or the batches."""
        self.check_topic(topic)
        if timeout is not None:
            check_timeout("timeout", timeout)
        if isinstance(bodies, bytes | bytearray | str):
            raise InvalidType("publish_many takes a list of message bodies, not a single body")
        if type(bodies) is not list and not isinstance(bodies, Iterable):
            raise InvalidType(
                f"publish_many takes a list of message bodies, not {type(bodies).__name__}"
            )
        checked = bodies if type(bodies) is list else list(bodies)
        if not checked:
            raise InvalidArgument("publish_many needs at least one message")
        if (
            trace_ids is None
            and tags is None
            and headers is None
            and partition is None
            and sharding_key is None
            and not self._lookupds
            and not (self._compress_topics and topic in self._compress_topics)
            and not self.trace.enabled(topic)
        ):
            data = self._mpub_fast(topic, checked)
            if data is not None:
                return data
        if set(map(type, checked)) != {bytes}:
            checked = [check_body(b) for b in checked]
        lens = list(map(len, checked))
        same, shortest, longest, total = sizes(lens)
        if shortest == 0:
            raise InvalidArgument("message bodies must not be empty (nsqd rejects them)")
        if tags is not None or headers is not None or topic in self._compress_topics:
            ext = self._many_ext(topic, checked, tags, trace_ids, partition, sharding_key, headers)
            if ext is not None:
                return ext
        limit = self.max_message_size
        if longest > limit:
            raise MessageTooLarge(
                f"message of {longest} bytes exceeds max_message_size ({limit}); nothing was sent"
            )
        if trace_ids is None and self.trace.enabled(topic):
            trace_ids = [new_trace_id() for _ in checked]
        if trace_ids is not None:
            if not isinstance(trace_ids, Iterable):
                raise InvalidType(f"trace_ids must be a list of ints, not {trace_ids!r}")
            trace_ids = list(trace_ids)
            if len(trace_ids) != len(checked):
                raise InvalidArgument(
                    f"got {len(checked)} messages but {len(trace_ids)} trace ids; "
                    "give one per message"
                )
            for t in trace_ids:
                check_trace_id(t)
        overhead = 12 if trace_ids is not None else 4
        if 4 + overhead * len(lens) + total <= self.max_body_size:
            spans = [(0, len(lens))]
        else:
            spans = _spans([overhead + n for n in lens], self.max_body_size)
        routed = trace_ids is not None or partition is not None or sharding_key is not None
        if routed:
            self.check_routing(partition, sharding_key)
        routed = routed or bool(self._lookupds)
        requests = []
        for start, end in spans:
            batch = checked[start:end]
            if trace_ids is None:
                requests.append(
                    Request(partial(commands.mpub, topic, batch, size=same), count=len(batch))
                )
            else:
                build = partial(commands.mpub_trace, topic, batch, trace_ids[start:end])
                requests.append(Request(build, traced=True, count=len(batch)))
        return Batches(requests, len(checked), routed, trace_ids is not None)

    def _many_ext(
        self,
        topic: str,
        bodies: list[bytes],
        tags: Sequence[str | None] | None,
        trace_ids: Sequence[int] | None,
        partition: int | None,
        sharding_key: ShardingKey | None,
        headers: ManyHeaders = None,
    ) -> Batches | None:
        """MPUB_EXT batches for messages with headers, tags or compression; None when none
        applies."""
        if tags is not None:
            if isinstance(tags, str) or not isinstance(tags, Iterable):
                raise InvalidType("tags must be a list with one tag (or None) per message")
            tags = list(tags)
            if len(tags) != len(bodies):
                raise InvalidArgument(
                    f"got {len(bodies)} messages but {len(tags)} tags; give one per message "
                    "(None for an untagged one)"
                )
            for t in tags:
                if t is not None:
                    check_tag("tags", t)
        packs: list[tuple[bytes, dict[str, str]] | None] = [None] * len(bodies)
        if topic in self._compress_topics:
            packs = [self._compress(topic, b) for b in bodies]
        given = _many_headers(headers, len(bodies))
        if tags is None and not any(packs) and given is None:
            return None  # nothing to say in an ext header: plain MPUB
        if trace_ids is not None:
            raise InvalidArgument(
                "trace_ids cannot be combined with headers, tags or compression (MPUB_EXT has "
                "no traced answer); publish those messages one by one with trace_id="
            )
        self.check_routing(partition, sharding_key)
        sent: list[bytes] = []
        ext: list[dict[str, Any] | None] = []
        lens: list[int] = []
        for i, body in enumerate(bodies):
            tag = None if tags is None else tags[i]
            packed = packs[i]
            if packed is not None:
                body = packed[0]
            mine = None if given is None else given[i]
            header = (
                None
                if tag is None and packed is None and mine is None
                else _ext_headers(mine, tag, packed)
            )
            if len(body) > self.max_message_size:
                raise MessageTooLarge(
                    f"message of {len(body)} bytes exceeds max_message_size "
                    f"({self.max_message_size}); nothing was sent"
                )
            sent.append(body)
            ext.append(header)
            # [size][header length][header][body]; the header is small JSON, sized as sent
            lens.append(6 + len(commands.json_header(header) if header else b"") + len(body))
        requests = []
        for start, end in _spans(lens, self.max_body_size):
            build = partial(commands.mpub_ext, topic, sent[start:end], ext[start:end])
            requests.append(Request(build, count=end - start, ext=True))
        return Batches(requests, len(bodies), True, False)

    def _mpub_fast(self, topic: str, bodies: list[Any]) -> bytes | None:
        """The MPUB for the usual call: one batch of non-empty bytes-like bodies that fit.

        The encoding does the type check (``bytes.join`` takes only bytes-like objects, as
        :func:`check_body` does) and the length of the result shows any body whose ``len()``
        is not its size in bytes, so valid input costs no separate pass. ``None``: take the
        general path, which also words the error for bad input.
        """
        try:
            lens = list(map(len, bodies))
        except TypeError:
            return None
        same, shortest, longest, total = sizes(lens)
        body_size = 4 + 4 * len(lens) + total
        if shortest == 0 or longest > self.max_message_size or body_size > self.max_body_size:
            return None
        try:
            data = commands.mpub(topic, bodies, None, same)
        except TypeError:  # not bytes-like
            return None
        # "MPUB " + topic + "\n" + body length + body; topic names are ASCII
        return data if len(data) == 10 + len(topic) + body_size else None

    def check_routing(self, partition: int | None, key: ShardingKey | None) -> None:
        if partition is not None and key is not None:
            raise InvalidArgument("give either partition or sharding_key, not both")
        if partition is not None and (
            not isinstance(partition, int) or isinstance(partition, bool) or partition < 0
        ):
            raise InvalidArgument(f"partition must be an int >= 0, not {partition!r}")
        if key is not None:
            check_key(key, self._sharder)  # what the sharding can hash, said clearly
            if not self._lookupds:
                raise InvalidArgument(
                    "sharding_key needs the topic's partition count: configure "
                    "lookupd_http_addresses (or pass partition= yourself)"
                )

    def result(
        self, topic: str, request: Request, answer: bytes, address: str, part: int | None
    ) -> PublishResult | None:
        """The PublishResult of a traced answer (logged when tracing is on for the topic)."""
        if not request.traced:
            return None
        result = decode_publish_response(answer)
        if result is not None and self.trace.enabled(topic):
            emit_publish(topic, part, address, result, count=request.count)
        return result

    @staticmethod
    def ext_layout(layout: TopicLayout) -> bool:
        """Whether a topic's write layout says it carries Youzan ext headers."""
        return bool(layout.meta is not None and layout.meta.extend_support)


class BatchRun:
    """One ``publish_many`` while its batches go out in order: what was acknowledged, the
    results of traced batches, and what a failed batch raises."""

    __slots__ = ("_done", "_plan", "_planner", "_results", "_topic")

    def __init__(self, planner: Plan, topic: str, plan: Batches) -> None:
        self._planner = planner
        self._topic = topic
        self._plan = plan
        self._done = 0  # messages acknowledged
        self._results: list[PublishResult] = []

    def answered(self, request: Request, answer: bytes, address: str, part: int | None) -> None:
        result = self._planner.result(self._topic, request, answer, address, part)
        if result is not None:
            self._results.append(result)
        self._done += request.count

    @property
    def unacknowledged(self) -> int:
        """Messages of the call not acknowledged (so far)."""
        return self._plan.total - self._done

    def failed(self, exc: NSQError) -> NSQError:
        """What to raise after ``exc`` (the caller counts :attr:`unacknowledged` as failed)."""
        return batch_failed(exc, self._done, self._plan.total)

    def results(self) -> list[PublishResult] | None:
        return self._results if self._plan.traced else None


def timeout_error(limit: float) -> NSQTimeout:
    return NSQTimeout(
        f"publish not acknowledged within {limit}s; it may or may not have been published "
        "(nsqd may store it, even later); it is not sent again"
    )


def not_sent_error(limit: float, cause: BaseException | None) -> NoNsqdAvailable:
    """The call's time ran out before the publish was sent (connecting, a lookup, a retry's
    wait): unlike :func:`timeout_error`, nsqd cannot hold it."""
    while isinstance(cause, NSQTimeout) and cause.__cause__ is not None:
        cause = cause.__cause__  # "no time left to retry": say what failed
    reason = f" (last: {cause})" if cause is not None and str(cause) else ""
    return NoNsqdAvailable(
        f"publish not sent: no nsqd took it within {limit}s{reason}; nothing was sent, so "
        "publishing it again is safe"
    )


def batch_failed(exc: NSQError, done: int, total: int) -> NSQError:
    """What a publish_many raises when a batch fails after ``done`` messages were
    acknowledged: the error itself if none were, else :class:`PartialPublish`."""
    if done == 0:
        return exc
    err = PartialPublish(f"published {done} of {total} messages, then a batch failed: {exc}", done)
    err.__cause__ = exc
    return err
