"""A producer's settings, checked once, sans-IO: :class:`Settings`.

Both front doors take the same keywords (documented once, on :class:`smartnsq.Producer`) and
hand them here; every part reads what it needs from the result.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from smartnsq._checks import (
    DELAY_LIMIT,
    check_addresses,
    check_identify,
    check_number,
    check_timeout,
)
from smartnsq.errors import InvalidArgument, InvalidType
from smartnsq.lookup.client import check_lookupd_addresses
from smartnsq.ordered.sharding import Sharder, sharder_for
from smartnsq.protocol.compress import check_codec
from smartnsq.protocol.handshake import ConnectionConfig, parse_address
from smartnsq.protocol.names import validate_topic

__all__ = ["DEFAULT_MAX_BODY_SIZE", "DEFAULT_MAX_MESSAGE_SIZE", "Settings"]

DEFAULT_MAX_MESSAGE_SIZE = 1024 * 1024  # nsqd --max-msg-size default
DEFAULT_MAX_BODY_SIZE = 5 * 1024 * 1024  # nsqd --max-body-size default
# nsqd answers a publish at once; one unanswered this long (or a tenth of the timeout) means
# the node has most likely stopped answering.
_STALL_MAX = 0.5


class Settings:
    """A producer's settings, checked: raises what to fix before anything is opened."""

    def __init__(
        self,
        *,
        nsqd_tcp_addresses: Sequence[str],
        lookupd_http_addresses: Sequence[str],
        lookupd_poll_interval: float,
        sharding: Literal["go", "java"] | Sharder,
        connections_per_nsqd: int,
        timeout: float,
        max_retries: int,
        retry_backoff: float,
        max_message_size: int,
        max_body_size: int,
        tls: ssl.SSLContext | bool,
        tls_hostname: str | None,
        snappy: bool,
        deflate: bool,
        deflate_level: int,
        auth_secret: str | bytes | None,
        heartbeat_interval: float,
        connect_timeout: float,
        client_id: str | None,
        identify: dict[str, Any] | None,
        max_delay: float,
        auth_over_plaintext: bool,
        compress_topics: Iterable[str],
        compress_codec: Literal["snappy", "gzip", "lz4"],
        compress_min_size: int,
        busy_poll: float,
    ) -> None:
        nsqd_tcp_addresses = check_addresses("nsqd_tcp_addresses", nsqd_tcp_addresses)
        lookupds = check_lookupd_addresses(
            check_addresses("lookupd_http_addresses", lookupd_http_addresses)
        )
        if not nsqd_tcp_addresses and not lookupds:
            raise InvalidArgument(
                "Producer needs nsqd_tcp_addresses or lookupd_http_addresses (or both)"
            )
        for address in nsqd_tcp_addresses:
            parse_address(address)
        check_number("connections_per_nsqd", connections_per_nsqd, integer=True, min=1)
        check_timeout("timeout", timeout)
        check_number("max_retries", max_retries, integer=True, min=0)
        check_number("retry_backoff", retry_backoff, min=0)
        check_number("max_message_size", max_message_size, integer=True)
        check_number("max_body_size", max_body_size, integer=True)
        check_timeout("lookupd_poll_interval", lookupd_poll_interval)
        check_number("max_delay", max_delay, min=0, max=DELAY_LIMIT)
        if identify is not None:
            check_identify("identify", identify)
        if max_message_size < 1 or max_body_size < max_message_size + 8:
            raise InvalidArgument("need 1 <= max_message_size and max_body_size >= it + 8")
        if isinstance(compress_topics, str | bytes) or not isinstance(compress_topics, Iterable):
            raise InvalidType("compress_topics must be a list of topic names")
        compress = frozenset(validate_topic(t) for t in compress_topics)
        self.compress_codec = check_codec(compress_codec, used=bool(compress))
        check_number("compress_min_size", compress_min_size, integer=True, min=0)
        self.compress_min_size = compress_min_size
        self.compress_topics = compress  # empty when off
        self.config = ConnectionConfig(
            client_id=client_id,
            tls=tls,
            tls_hostname=tls_hostname,
            snappy=snappy,
            deflate=deflate,
            deflate_level=deflate_level,
            auth_secret=auth_secret,
            heartbeat_interval=heartbeat_interval,
            connect_timeout=connect_timeout,
            handshake_timeout=connect_timeout,
            identify_extra=identify or {},
            auth_over_plaintext=auth_over_plaintext,
            busy_poll=busy_poll,
        )
        self.nsqd_tcp_addresses = list(dict.fromkeys(nsqd_tcp_addresses))
        self.lookupds = lookupds
        self.lookupd_poll_interval = lookupd_poll_interval
        self.sharder = sharder_for(sharding)
        self.connections_per_nsqd = connections_per_nsqd
        self.timeout = timeout
        # A node whose oldest request waited this long is passed over while another works.
        self.stall_after = min(_STALL_MAX, timeout / 10)
        self.max_retries = max_retries
        self.retry_backoff = retry_backoff
        self.max_message_size = max_message_size
        self.max_body_size = max_body_size
        self.max_delay = max_delay
