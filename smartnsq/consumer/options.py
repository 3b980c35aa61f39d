"""A consumer's options, checked once: the async and the blocking Consumer both build
:class:`Options` from their keyword arguments (the documentation of each is
:class:`smartnsq.Consumer`'s)."""

from __future__ import annotations

import inspect
import ssl
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from smartnsq._checks import (
    DELAY_LIMIT,
    check_addresses,
    check_bool,
    check_callable,
    check_number,
)
from smartnsq.connection import ConnectionConfig, parse_address
from smartnsq.errors import InvalidArgument, InvalidType
from smartnsq.lookup.client import check_lookupd_addresses
from smartnsq.message import Message
from smartnsq.offsets import StartPlan
from smartnsq.protocol.names import validate_channel, validate_topic
from smartnsq.protocol.offsets import Start
from smartnsq.protocol.tags import check_tag

#: What a handler may return: None (or anything but False) FINs the message, False REQs it.
#: An awaitable (what an ``async def`` handler, or a plain function forwarding to one,
#: returns) is awaited first and its result counts.
Handler = Callable[[Message], Awaitable[bool | None] | bool | None]


def is_async_handler(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is an ``async def`` function, or an object whose ``__call__`` is."""
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return call is not None and inspect.iscoroutinefunction(call)


#: ``on_giving_up``: called with the message, and the reason when it takes two arguments.
GivingUp = Callable[[Message], Any] | Callable[[Message, Exception | None], Any]


def takes_reason(fn: Callable[..., Any]) -> bool:
    """Whether an ``on_giving_up`` callback takes a second argument, the reason."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature to read (some builtins): one argument
        return False
    positional = 0
    for p in params:
        if p.kind is p.VAR_POSITIONAL:
            return True
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            positional += 1
    return positional >= 2


@dataclass
class Options:
    """Every argument of :class:`smartnsq.Consumer`, checked on creation; derived values
    (``direct``, ``lookupds``, ``concurrency``, ``config``, ``start``) follow them."""

    topic: str
    channel: str
    handler: Handler | None = None
    nsqd_tcp_addresses: Sequence[str] = ()
    lookupd_http_addresses: Sequence[str] = ()
    max_in_flight: int = 1
    max_attempts: int = 5
    requeue_delay: float = 90.0
    max_requeue_delay: float = 3600.0
    backoff: bool = True
    max_backoff_duration: float = 128.0
    backoff_unit: float = 1.0
    lookupd_poll_interval: float = 60.0
    lookupd_poll_jitter: float = 0.3
    reconnect_min: float = 0.5
    reconnect_max: float = 60.0
    rdy_redistribute_interval: float = 5.0
    low_rdy_idle_timeout: float = 10.0
    concurrency: int | None = None
    auto_touch: bool | None = None
    msg_timeout: float | None = None
    heartbeat_interval: float = 30.0
    on_giving_up: GivingUp | None = None
    tls: ssl.SSLContext | bool = False
    tls_hostname: str | None = None
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 6
    auth_secret: str | bytes | None = field(default=None, repr=False)
    client_id: str | None = None
    sample_rate: int = 0
    connect_timeout: float = 5.0
    ordered: bool | None = None
    ext: bool | None = None
    on_order_violation: Callable[[Message, int, int], Any] | None = None
    on_blocked: Callable[[Message], Any] | None = None
    blocked_warn_attempts: int = 10
    blocked_error_attempts: int = 50
    auth_over_plaintext: bool = True
    start: Start = None
    partitions: Iterable[int] | None = None
    advanced: bool = False
    desired_tag: str | None = None
    output_buffer_timeout: float | None = None
    output_buffer_size: int | None = None
    dead_letter_topic: str | None = None

    def __post_init__(self) -> None:
        self.topic = validate_topic(self.topic)
        self.channel = validate_channel(self.channel)
        if self.handler is not None and not callable(self.handler):
            raise InvalidType("handler must be a callable taking one Message (or None to pull)")
        direct = check_addresses("nsqd_tcp_addresses", self.nsqd_tcp_addresses)
        for address in direct:
            parse_address(address)
        self.direct = list(dict.fromkeys(direct))
        self.lookupds = check_lookupd_addresses(
            check_addresses("lookupd_http_addresses", self.lookupd_http_addresses)
        )
        if not self.direct and not self.lookupds:
            raise InvalidArgument(
                "Consumer needs nsqd_tcp_addresses or lookupd_http_addresses (or both)"
            )
        if self.dead_letter_topic is not None:
            self.dead_letter_topic = validate_topic(self.dead_letter_topic)
            if self.dead_letter_topic == self.topic:
                raise InvalidArgument(
                    "dead_letter_topic must differ from the topic consumed: messages given up "
                    "on would come straight back"
                )
        check_number("max_in_flight", self.max_in_flight, integer=True, min=0)
        check_number("max_attempts", self.max_attempts, integer=True, min=0)
        if self.dead_letter_topic is not None and self.max_attempts == 0:
            raise InvalidArgument(
                "dead_letter_topic needs max_attempts >= 1: with 0 (no limit) no message is "
                "ever given up, so none would reach the dead-letter topic"
            )
        check_number("requeue_delay", self.requeue_delay, min=0)
        check_number("max_requeue_delay", self.max_requeue_delay, min=0, max=DELAY_LIMIT)
        check_bool("backoff", self.backoff)
        check_number("lookupd_poll_jitter", self.lookupd_poll_jitter)
        check_number("concurrency", self.concurrency, integer=True, allow_none=True)
        check_bool("auto_touch", self.auto_touch, allow_none=True)
        check_bool("ordered", self.ordered, allow_none=True)
        check_bool("ext", self.ext, allow_none=True)
        if self.desired_tag is not None:
            check_tag("desired_tag", self.desired_tag)
            if self.ext is False:
                raise InvalidArgument("desired_tag needs an ext topic: leave ext=None (or True)")
        check_callable("on_order_violation", self.on_order_violation)
        check_callable("on_blocked", self.on_blocked)
        check_number("blocked_warn_attempts", self.blocked_warn_attempts, integer=True, min=1)
        check_number("blocked_error_attempts", self.blocked_error_attempts, integer=True, min=1)
        self.start_plan = StartPlan.from_options(
            self.topic,
            self.channel,
            self.start,
            self.partitions,
            self.advanced,
            self.direct,
            self.lookupds,
        )
        for name in (
            "max_backoff_duration",
            "backoff_unit",
            "lookupd_poll_interval",
            "reconnect_min",
            "reconnect_max",
            "rdy_redistribute_interval",
            "low_rdy_idle_timeout",
        ):
            check_number(name, getattr(self, name), above=0)
        if not 0 <= self.lookupd_poll_jitter < 1:
            raise InvalidArgument("lookupd_poll_jitter must be in [0, 1)")
        if self.concurrency is not None and self.concurrency < 1:
            raise InvalidArgument("concurrency must be >= 1")
        if self.on_giving_up is not None and not callable(self.on_giving_up):
            raise InvalidType("on_giving_up must be callable")
        self.giving_up_reason = self.on_giving_up is not None and takes_reason(self.on_giving_up)
        self.async_handler = self.handler is not None and is_async_handler(self.handler)
        self.reconnect_max = max(self.reconnect_max, self.reconnect_min)
        self.workers = self.concurrency or max(1, min(self.max_in_flight, 100))
        self.config = ConnectionConfig(
            client_id=self.client_id,
            tls=self.tls,
            tls_hostname=self.tls_hostname,
            snappy=self.snappy,
            deflate=self.deflate,
            deflate_level=self.deflate_level,
            auth_secret=self.auth_secret,
            heartbeat_interval=self.heartbeat_interval,
            msg_timeout=self.msg_timeout,
            sample_rate=self.sample_rate,
            connect_timeout=self.connect_timeout,
            auth_over_plaintext=self.auth_over_plaintext,
            output_buffer_size=self.output_buffer_size,
            output_buffer_timeout=self.output_buffer_timeout,
        )
