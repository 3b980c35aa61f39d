# Generated from smartnsq/producer/front.py by scripts/unasync.py: do not edit.
# Edit smartnsq/producer/front.py, then run `python scripts/unasync.py`.
"""The blocking twin of :mod:`smartnsq.producer.front`, generated from it: see that module."""

from __future__ import annotations

import ssl
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from smartnsq._checks import DEFAULT_MAX_DELAY
from smartnsq.net.busy_poll import DEFAULT_LIMIT as BUSY_POLL_LIMIT
from smartnsq.ordered.sharding import Sharder, ShardingKey
from smartnsq.producer.io_sync import SyncPublisher
from smartnsq.producer.links_sync import SyncLinks
from smartnsq.producer.plan import ManyHeaders, Plan
from smartnsq.producer.settings import DEFAULT_MAX_BODY_SIZE, DEFAULT_MAX_MESSAGE_SIZE, Settings
from smartnsq.protocol.compress import DEFAULT_MIN_SIZE
from smartnsq.protocol.message import PublishResult
from smartnsq.stats import ProducerStats
from smartnsq.trace import TraceSwitch

__all__ = ["Producer"]


class Producer:
    """Publishes messages to one or more nsqd from plain (non-async) code.

    The same arguments, methods and guarantees as [`smartnsq.Producer`][smartnsq.Producer],
    without ``await``:

        with Producer(["127.0.0.1:4150"]) as producer:
            producer.publish("events", b"hello")

    Each call returns once nsqd has acknowledged the message, or raises. It is thread-safe:
    many threads may publish through one Producer at once; their requests are pipelined over
    its connections and every caller gets its own answer. Publishing uses blocking sockets:
    no event loop and no background thread. Lookups (the first publish to a topic through
    lookupd, about once per ``lookupd_poll_interval``, and after cluster errors) run the same
    lookup code as the async client on a short-lived event loop in the calling thread.
    A Producer cannot be used after ``fork()``
    ([`UsedAfterFork`][smartnsq.errors.UsedAfterFork]): create one in the child.
    """

    def __init__(
        self,
        nsqd_tcp_addresses: Sequence[str] = (),
        *,
        lookupd_http_addresses: Sequence[str] = (),
        lookupd_poll_interval: float = 60.0,
        sharding: Literal["go", "java"] | Sharder = "go",
        connections_per_nsqd: int = 1,
        timeout: float = 10.0,
        max_retries: int = 3,
        retry_backoff: float = 0.05,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        max_body_size: int = DEFAULT_MAX_BODY_SIZE,
        tls: ssl.SSLContext | bool = False,
        tls_hostname: str | None = None,
        snappy: bool = False,
        deflate: bool = False,
        deflate_level: int = 6,
        auth_secret: str | bytes | None = None,
        heartbeat_interval: float = 30.0,
        connect_timeout: float = 5.0,
        client_id: str | None = None,
        identify: dict[str, Any] | None = None,
        max_delay: float = DEFAULT_MAX_DELAY,
        auth_over_plaintext: bool = True,
        compress_topics: Iterable[str] = (),
        compress_codec: Literal["snappy", "gzip", "lz4"] = "snappy",
        compress_min_size: int = DEFAULT_MIN_SIZE,
        busy_poll: float = BUSY_POLL_LIMIT,
    ) -> None:
        """Both producers, [`smartnsq.Producer`][smartnsq.Producer] and
        [`smartnsq.sync.Producer`][smartnsq.sync.Producer], take these settings.

        Args:
            nsqd_tcp_addresses: nsqd TCP addresses (``host:port``) to publish to; publishes go
                to the healthy one with the fewest requests awaiting an answer, taking turns
                among equals. One whose oldest request has waited longer than a tenth of
                ``timeout`` (at most 0.5 s; nsqd answers at once) is stalled: passed over while
                another nsqd works, not marked down, used again once it answers. May be passed
                positionally.
            lookupd_http_addresses: nsqlookupd HTTP addresses (``host:port`` or an ``http(s)://``
                URL). With them, each topic's nsqd (on Youzan, its partitions and their leaders)
                come from the lookupds. A topic no lookupd knows yet goes, on a classic
                cluster, to one of the nsqd the lookupds know (nsqd creates a topic on its
                first PUB), with the usual failover; on the Youzan fork, where topics are
                created by an operator, it raises
                [`TopicNotFound`][smartnsq.errors.TopicNotFound] at once. At least one of
                ``nsqd_tcp_addresses`` and ``lookupd_http_addresses`` is required.
            lookupd_poll_interval: How long a topic's lookup answer is reused before the lookupds
                are asked again (with some jitter), in seconds, default 60.0. Cluster errors
                (a partition moved, its leader changed) refresh it at once.
            sharding: How a ``sharding_key`` maps to a Youzan partition: ``"go"`` (default;
                go-nsq's MurmurHash3 mapping), ``"java"`` (the Java SDK's ``hashCode`` mapping:
                a ``str`` key, or UTF-8 ``bytes``, matches ``setTopicShardingIDString``, an
                ``int`` key in Java's long range ``setTopicShardingIDLong``; other keys raise
                [`InvalidArgument`][smartnsq.errors.InvalidArgument]) or a callable
                ``(key, partition_count) -> partition``.
            connections_per_nsqd: Most connections opened to one nsqd, an int >= 1, default 1.
                Requests are pipelined on each; more connections help only when one is
                saturated.
            timeout: Seconds a publish may take, retries included, unless the call gives its own
                ``timeout``; default 10.0. When it runs out,
                [`NSQTimeout`][smartnsq.errors.NSQTimeout] says the outcome is unknown.
            max_retries: Retries after a failure that is safe to retry (a broken connection, a
                retryable server error), an int >= 0, default 3; on another nsqd when there is
                one.
            retry_backoff: Wait before the first retry, in seconds, default 0.05; it doubles
                with each retry (plus up to 50 % at random).
            max_message_size: Largest message body accepted, in bytes, default 1 MiB (nsqd's
                ``--max-msg-size`` default); larger bodies raise
                [`MessageTooLarge`][smartnsq.errors.MessageTooLarge] before anything is sent.
            max_body_size: Largest MPUB body, in bytes, default 5 MiB (nsqd's
                ``--max-body-size`` default); ``publish_many`` splits its batch to fit. At least
                ``max_message_size + 8``.
            tls: ``True`` for TLS with the system's trusted certificates and host name
                verification, an ``ssl.SSLContext`` for your own settings (client certificates, a
                private CA), ``False`` (default) for plain TCP.
            tls_hostname: Name the server certificate is checked against; default: the host of
                the nsqd address.
            snappy: Compress connections with Snappy. Default False.
            deflate: Compress connections with DEFLATE (not together with ``snappy``). Default
                False.
            deflate_level: DEFLATE level, 1 to 9, default 6.
            auth_secret: Secret sent with AUTH when nsqd requires authentication. Without TLS it
                is readable on the network: a warning is given once per process (see
                ``auth_over_plaintext``).
            heartbeat_interval: How often nsqd sends a heartbeat, in seconds: 1 to 60, or -1 to
                disable; default 30.0. A connection silent for two intervals (plus 10 %) is
                closed and its nsqd avoided for a while.
            connect_timeout: Seconds allowed for the TCP connection to an nsqd, and again for
                its handshake, default 5.0. A connection that does not complete them in time
                (an nsqd that accepts connections but does not answer) is a failed connect:
                nothing was sent, so the publish goes to another nsqd within its
                ``timeout``. Keep it below ``timeout`` for that to fit in one call.
            client_id: Client id reported to nsqd (shown in its stats); default: the short host
                name.
            identify: Extra fields for the IDENTIFY command (a dict of JSON values), sent as
                they are. Default None.
            max_delay: Longest ``delay`` ``publish`` accepts, in
                seconds, default 3600.0 (classic nsqd's default ``--max-req-timeout``); raise it
                when your nsqd allows more.
            auth_over_plaintext: ``False`` refuses to send ``auth_secret`` to an nsqd that asks
                for it over an unencrypted connection: the connection fails with
                [`InsecureAuth`][smartnsq.errors.InsecureAuth]. Default True.
            compress_topics: Youzan ext topics whose bodies the producer compresses itself, as
                go-nsq's ``TopicsForCompress`` does: a body of at least ``compress_min_size``
                bytes is sent compressed with PUB_EXT (MPUB_EXT) and the ext headers
                ``nsq.client.compress`` and ``nsq.msg.size``, which go-nsq and smartnsq
                consumers decompress. The topics must be ext topics. Default: none.
            compress_codec: ``"snappy"`` (default), ``"gzip"`` or ``"lz4"`` (needs
                ``pip install 'smartnsq[lz4]'``; a body that lz4 cannot shrink is sent as it is).
            compress_min_size: smallest body, in bytes, that is compressed (go-nsq's
                ``MessageSizeForCompress``, default 20480).
            busy_poll: Longest time, in seconds, a publish alone in flight on its connection
                keeps polling for nsqd's answer before the event loop (the blocking Producer:
                the thread) may sleep; default 0.0005, 0 turns it off. On a virtual machine an
                idle loop can take longer to wake than a local nsqd takes to answer, so this can
                cut a sequential publish's round trip by a third or more. It polls for about
                twice the answer times seen so far (giving the CPU away between polls), and
                not at all while they are longer than ``busy_poll`` (a remote or busy nsqd)
                or when the publish comes more than ``busy_poll`` after the last answer (a
                caller that paces itself). Concurrent publishes never poll; nor does a
                Producer on trio.

        Raises:
            InvalidArgument: A value is out of range, or neither ``nsqd_tcp_addresses`` nor
                ``lookupd_http_addresses`` was given.
            InvalidType: A value has the wrong type.

        """
        arguments = dict(locals())
        del arguments["self"]
        self._settings = settings = Settings(**arguments)
        self._plan = plan = Plan(settings)
        self._links = links = SyncLinks(settings)
        self._io = SyncPublisher(settings, plan, links)

    @property
    def trace(self) -> TraceSwitch:
        """Run-time trace switch ([`TraceSwitch`][smartnsq.trace.TraceSwitch]): while
        tracing is on for a topic, every publish to it is traced (a trace id is generated when
        none is given) and written as a ``publish`` trace record."""
        return self._plan.trace

    @property
    def timeout(self) -> float:
        """The ``timeout`` setting: seconds a publish may take, retries included (read-only)."""
        return self._settings.timeout

    @property
    def max_retries(self) -> int:
        """The ``max_retries`` setting (read-only)."""
        return self._settings.max_retries

    @property
    def retry_backoff(self) -> float:
        """The ``retry_backoff`` setting, in seconds (read-only)."""
        return self._settings.retry_backoff

    @property
    def max_message_size(self) -> int:
        """The ``max_message_size`` setting, in bytes (read-only)."""
        return self._settings.max_message_size

    @property
    def max_body_size(self) -> int:
        """The ``max_body_size`` setting, in bytes (read-only)."""
        return self._settings.max_body_size

    @property
    def max_delay(self) -> float:
        """The ``max_delay`` setting, in seconds (read-only)."""
        return self._settings.max_delay

    @property
    def compress_codec(self) -> str:
        """The ``compress_codec`` setting (read-only)."""
        return self._settings.compress_codec

    @property
    def compress_min_size(self) -> int:
        """The ``compress_min_size`` setting, in bytes (read-only)."""
        return self._settings.compress_min_size

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> Producer:
        self._links.enter()
        try:
            self._io.check_settings()
        except BaseException:  # refused, or cancelled: leave nothing open
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, timeout: float = 5.0) -> None:
        """Wait for outstanding answers (briefly), then close every connection.

        ``with`` calls it on exit; calling it again does nothing.

        Args:
            timeout: Seconds each connection waits for its outstanding answers, default
                5.0; 0 closes at once (a publish still waiting then raises).
        """
        self._links.close(timeout)

    # -- publishing ------------------------------------------------------------------------------

    def stats(self) -> ProducerStats:
        """Counters since the producer was created, in total and per nsqd.

        Returns:
            A :class:`~smartnsq.ProducerStats` snapshot.
        """
        return self._io.stats()

    def is_ext_topic(self, topic: str) -> bool:
        """Whether ``topic`` carries Youzan ext headers (JSON ``headers=``), as lookupd's
        topic metadata says; asked once and cached like the topic's layout.

        Args:
            topic: The topic.

        Returns:
            True for a Youzan ext topic; False for any other, for a topic no lookupd knows
            yet, and for a Producer without ``lookupd_http_addresses`` (nothing to ask).

        Raises:
            InvalidTopic: A bad topic name.
            LookupFailed: No lookupd answered.
            NSQTimeout: The lookup took longer than the Producer's ``timeout``.
        """
        return self._io.is_ext_topic(topic)

    def publish(
        self,
        topic: str,
        body: bytes,
        *,
        delay: float | None = None,
        partition: int | None = None,
        sharding_key: ShardingKey | None = None,
        trace_id: int | None = None,
        headers: Mapping[str, Any] | None = None,
        tag: str | None = None,
        timeout: float | None = None,
    ) -> PublishResult | None:
        """Publish one message and return once nsqd has acknowledged it.

        ``delay`` defers delivery (DPUB; classic nsqd only). On a partitioned (Youzan)
        topic, ``sharding_key`` picks the partition (same key, same partition, in order) and
        ``partition`` names one outright; otherwise partitions take turns.
        ``trace_id`` (or tracing switched on for the topic with ``producer.trace``) sends a
        traced publish and returns a [`PublishResult`][smartnsq.PublishResult]; ``headers``
        sends the JSON ext header of an ext topic. Plain publishes return ``None``.
        On a connection failure before it was sent, or a server error that is safe to
        retry, it is retried (up to ``max_retries``, within ``timeout``), on another nsqd
        when there is one; once sent, it is never sent again.

        Args:
            topic: The topic (NSQ's naming rules).
            body: The message: bytes or any other bytes-like object (bytearray,
                memoryview, ...); its bytes are sent. Not empty, at most
                ``max_message_size`` bytes.
            delay: Seconds before nsqd delivers it (DPUB; classic nsqd only), at most the
                Producer's ``max_delay``. Not combined with ``trace_id`` or ``headers``.
            partition: Youzan: the partition to publish to.
            sharding_key: Youzan: a key (bytes, str or int) that picks the partition with the
                Producer's ``sharding`` mapping: the same key always goes to the same
                partition, so its messages keep their order.
            trace_id: Youzan: publish traced (``PUB_TRACE``) with this trace id (an int in
                ``[0, 2**64)``) and return a [`PublishResult`][smartnsq.PublishResult].
            headers: Youzan ext topics: the JSON ext header (a mapping of JSON values),
                sent with ``PUB_EXT``.
            timeout: Seconds this call may take, retries included; default: the Producer's
                ``timeout``.
            tag: dispatch tag of the message (Youzan ext topics): only consumers whose
                ``desired_tag`` is the same receive it (untagged consumers while none is
                connected). 1-100 ASCII letters, digits, ``_`` or ``-``; sent as the ext
                header ``##client_dispatch_tag``. A topic that is not an ext topic refuses
                it with [`ExtNotSupported`][smartnsq.errors.ExtNotSupported].

        Returns:
            A [`PublishResult`][smartnsq.PublishResult] (partition, internal id, offset) for
                a traced publish, else None.

        Raises:
            NSQTimeout: No answer within ``timeout``: the message may or may not have been
                published (nsqd may store it, even later); it is not sent again.
            OutcomeUnknown: The connection ended after the message was sent and before
                nsqd's answer: it may or may not have been published; it is not sent again.
            MessageTooLarge: ``body`` is larger than ``max_message_size``; nothing was sent.
            InvalidArgument: A bad argument (an empty body, a delay out of range, a
                partition that does not exist); nothing was sent.
            InvalidType: An argument of the wrong type; nothing was sent.
            NotSupported: ``delay`` on a Youzan nsqd, or ``partition`` on a classic one;
                nothing was sent.
            NoNsqdAvailable: No nsqd could take the message (all down, or none listed), or
                ``timeout`` ran out before it was sent ("publish not sent"): nothing was
                sent, publishing it again is safe.
            TopicNotFound: With ``lookupd_http_addresses`` on the Youzan fork: no lookupd
                knows the topic (an operator creates topics there). On a classic cluster a
                new topic goes to one of the nsqd the lookupds know, which creates it.
            ServerError: nsqd refused the message and a retry cannot help (or the retries
                ran out).
            ConnectionClosed: The connection failed before the message was sent and the
                retries ran out.
        """
        return self._io.publish(
            topic, body, delay, partition, sharding_key, trace_id, headers, tag, timeout
        )

    def publish_many(
        self,
        topic: str,
        bodies: Iterable[bytes],
        *,
        partition: int | None = None,
        sharding_key: ShardingKey | None = None,
        trace_ids: Sequence[int] | None = None,
        tags: Sequence[str | None] | None = None,
        timeout: float | None = None,
        headers: ManyHeaders = None,
    ) -> list[PublishResult] | None:
        """Publish several messages with MPUB, split into as few batches as nsqd accepts.

        Batches go out in order, all to one partition. If one fails after earlier ones
        succeeded, [`PartialPublish`][smartnsq.errors.PartialPublish] says how many messages were
        acknowledged. With ``trace_ids`` (one per message; generated when tracing is on for the
        topic) it sends MPUB_TRACE and returns one [`PublishResult`][smartnsq.PublishResult]
        per batch.

        Args:
            topic: The topic (NSQ's naming rules).
            bodies: The messages, an iterable of bytes-like objects (at least one; each
                non-empty and at most ``max_message_size`` bytes). Split into as few MPUBs
                as fit ``max_body_size``.
            partition: Youzan: the partition to publish to.
            sharding_key: Youzan: a key that picks the partition (see
                [`publish`][smartnsq.Producer.publish]); every message goes to it.
            trace_ids: Youzan: one trace id per message; the batches go out as
                ``MPUB_TRACE``.
            timeout: Seconds each batch may take, retries included; default: the
                Producer's ``timeout``.
            tags: one dispatch tag (or ``None``) per message, as ``trace_ids`` gives one
                trace id per message; sent with MPUB_EXT (see ``tag`` of ``publish``).
                Cannot be combined with ``trace_ids``.
            headers: Youzan ext topics: the JSON ext header of every message (one mapping),
                or one mapping (or ``None``) per message; sent with MPUB_EXT. Cannot be
                combined with ``trace_ids``.

        Returns:
            For a traced publish (``trace_ids`` given, or tracing on for the topic), one
                [`PublishResult`][smartnsq.PublishResult] per batch (ids and offset of its
                first message); else None.

        Raises:
            PartialPublish: A later batch failed after earlier ones were acknowledged:
                ``published`` says how many messages were.
            NSQTimeout: No answer within ``timeout``: the failed batch may or may not have
                been published; it is not sent again.
            OutcomeUnknown: The connection ended after the batch was sent and before nsqd's
                answer: it may or may not have been published; it is not sent again.
            MessageTooLarge: A body is larger than ``max_message_size``; nothing was sent.
            InvalidArgument: A bad argument (no message, an empty body, a wrong number of
                trace ids); nothing was sent.
            InvalidType: An argument of the wrong type (a single body instead of a list);
                nothing was sent.
            NoNsqdAvailable: No nsqd could take the batch, or ``timeout`` ran out before
                it was sent ("publish not sent"): publishing it again is safe.
            TopicNotFound: As for [`publish`][smartnsq.Producer.publish].
            ServerError: nsqd refused the first batch and a retry cannot help.
            ConnectionClosed: The connection failed before the message was sent and the
                retries ran out.
        """
        return self._io.publish_many(
            topic, bodies, partition, sharding_key, trace_ids, tags, timeout, headers
        )
