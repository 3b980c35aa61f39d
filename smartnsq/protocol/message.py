"""Message frames and publish responses.

A message frame's layout is not self-describing: which optional blocks it carries depends on
what the connection negotiated. :class:`MessageLayout` captures that and
:func:`decode_message` follows it::

    [timestamp i64][attempts u16][id 16 bytes]
    [ext version u8][ext length u16][ext bytes]     only with ``ext`` (Youzan, ext topics)
    [queue offset u64][raw size u32]                only with ``offset`` (SUB_ORDERED/ADVANCED)
    [body]

Classic nsqd sends the id as 16 hex characters; the Youzan fork sends 8 bytes of internal id
and 8 bytes of trace id. Either way the id is echoed back verbatim.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any, TypeVar

from smartnsq.errors import ProtocolError
from smartnsq.protocol.frames import Span

_HEAD = struct.Struct(">qH")
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_OFFSET = struct.Struct(">QI")
_TRACED = struct.Struct(">QQQI")
# Where the parts of a message frame's data are, for hot paths that cut a read buffer in
# place (``start`` being where the frame's data starts in it): the id is
# ``src[start + ID_AT : start + HEAD_SIZE]``; a classic message's body starts at
# ``start + HEAD_SIZE``, an ordered (or advanced) one's with no ext header at
# ``start + OFFSET_HEAD_SIZE``.
ID_AT = 10
HEAD_SIZE = 26
OFFSET_HEAD_SIZE = 38
#: ``unpack_head(src, start)``: the ``(timestamp, attempts)`` of the frame data at ``start``.
unpack_head = _HEAD.unpack_from
# An ordered (or advanced) message with no ext header: timestamp, attempts, internal id, the
# trace id skipped, queue offset and raw size; the body follows.
OFFSET_HEAD = struct.Struct(">qHQ8xQI")
# The same with the trace id, signed (as Spark's long columns want it).
TRACED_OFFSET_HEAD = struct.Struct(">qHQqQI")

EXT_NONE = 0
EXT_TAG = 2
EXT_JSON = 4

PARTITION_SHIFT = 50
PARTITION_MASK = 0x3FF


def partition_of(internal_id: int) -> int:
    """The partition a Youzan internal message id belongs to."""
    return (internal_id >> PARTITION_SHIFT) & PARTITION_MASK


@dataclass(frozen=True, slots=True)
class MessageLayout:
    """What a connection negotiated, and so which blocks its message frames carry."""

    binary_id: bool = False  # Youzan fork: id = internal id + trace id
    ext: bool = False  # IDENTIFY extend_support on an ext topic
    offset: bool = False  # subscribed with SUB_ORDERED or SUB_ADVANCED


CLASSIC = MessageLayout()


class RawMessage:
    """One decoded message frame."""

    __slots__ = ("attempts", "body", "ext", "ext_version", "id", "offset", "raw_size", "timestamp")

    def __init__(
        self,
        timestamp: int,
        attempts: int,
        id: bytes,
        body: bytes,
        ext_version: int = EXT_NONE,
        ext: bytes | None = None,
        offset: int | None = None,
        raw_size: int | None = None,
    ) -> None:
        self.timestamp = timestamp  # nanoseconds since the epoch
        self.attempts = attempts
        self.id = id
        self.body = body
        self.ext_version = ext_version
        self.ext = ext
        self.offset = offset
        self.raw_size = raw_size

    @property
    def internal_id(self) -> int:
        """Youzan internal id (first 8 id bytes). Meaningless for classic hex ids."""
        return int(_U64.unpack_from(self.id, 0)[0])

    @property
    def trace_id(self) -> int:
        """Youzan trace id (last 8 id bytes). Meaningless for classic hex ids."""
        return int(_U64.unpack_from(self.id, 8)[0])

    @property
    def partition(self) -> int:
        return partition_of(self.internal_id)

    @property
    def headers(self) -> dict[str, Any]:
        """The JSON ext header, decoded (empty when the message has none)."""
        if self.ext_version != EXT_JSON or not self.ext:
            return {}
        try:
            value = json.loads(self.ext)
        except ValueError as exc:
            raise ProtocolError(f"message ext header is not JSON: {self.ext[:64]!r}") from exc
        if not isinstance(value, dict):
            raise ProtocolError("message ext header is not a JSON object")
        return value

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} id={self.id.hex()} attempts={self.attempts} "
            f"body={self.body[:32]!r}{'...' if len(self.body) > 32 else ''}>"
        )


M = TypeVar("M", bound=RawMessage)


def decode_message(data: bytes, layout: MessageLayout, cls: type[M]) -> M:
    """Decode the data of a message frame into an instance of ``cls``."""
    n = len(data)
    if n < 26:
        raise ProtocolError(f"message frame too short ({n} bytes, need at least 26)")
    timestamp, attempts = _HEAD.unpack_from(data, 0)
    pos = 26
    ext_version = EXT_NONE
    ext = None
    if layout.ext:
        if n < 27:
            raise ProtocolError("message frame ends before its ext version byte")
        ext_version = data[26]
        pos = 27
        if ext_version != EXT_NONE:
            if n < 29:
                raise ProtocolError("message frame ends before its ext length")
            (length,) = _U16.unpack_from(data, 27)
            pos = 29 + length
            if pos > n:
                raise ProtocolError(f"message ext block of {length} bytes overruns the frame")
            ext = data[29:pos]
    offset = raw_size = None
    if layout.offset:
        if pos + 12 > n:
            raise ProtocolError("message frame ends before its offset block")
        offset, raw_size = _OFFSET.unpack_from(data, pos)
        pos += 12
    return cls(timestamp, attempts, data[10:26], data[pos:], ext_version, ext, offset, raw_size)


def decode_span(src: bytes, start: int, end: int, layout: MessageLayout, cls: type[M]) -> M:
    """:func:`decode_message` of the frame data ``src[start:end]``, cut in place (no copy
    of the frame) for the layouts hot paths see: classic, and ordered without ext."""
    if layout.ext:
        return decode_message(src[start:end], layout, cls)
    if layout.offset:
        if end - start < OFFSET_HEAD_SIZE:
            raise ProtocolError("message frame ends before its offset block")
        timestamp, attempts, _, offset, raw_size = OFFSET_HEAD.unpack_from(src, start)
        return cls(
            timestamp,
            attempts,
            src[start + ID_AT : start + HEAD_SIZE],
            src[start + OFFSET_HEAD_SIZE : end],
            EXT_NONE,
            None,
            offset,
            raw_size,
        )
    if end - start < HEAD_SIZE:
        raise ProtocolError(f"message frame too short ({end - start} bytes, need at least 26)")
    timestamp, attempts = _HEAD.unpack_from(src, start)
    return cls(
        timestamp, attempts, src[start + ID_AT : start + HEAD_SIZE], src[start + HEAD_SIZE : end]
    )


def check_spans(spans: list[Span]) -> None:
    """Raise ProtocolError unless every message frame of a classic read holds a whole head
    (what :func:`span_ids`, :func:`span_heads` and :func:`span_bodies` cut)."""
    for _, start, end in spans:
        if end - start < HEAD_SIZE:
            raise ProtocolError(f"message frame too short ({end - start} bytes, need at least 26)")


def span_ids(src: bytes, spans: list[Span]) -> list[bytes]:
    """The message ids of a read's message frames (any layout)."""
    return [src[start + ID_AT : start + HEAD_SIZE] for _, start, _ in spans]


def span_heads(src: bytes, spans: list[Span]) -> list[tuple[int, int]]:
    """The ``(timestamp, attempts)`` of a read's message frames (any layout)."""
    return [_HEAD.unpack_from(src, start) for _, start, _ in spans]


def span_bodies(src: bytes, spans: list[Span]) -> list[bytes]:
    """The bodies of a classic read's message frames."""
    return [src[start + HEAD_SIZE : end] for _, start, end in spans]


def encode_message(
    msg: RawMessage, layout: MessageLayout = CLASSIC
) -> bytes:  # for tests and fakes
    parts = [_HEAD.pack(msg.timestamp, msg.attempts), msg.id]
    if layout.ext:
        parts.append(bytes([msg.ext_version]))
        if msg.ext_version != EXT_NONE:
            ext = msg.ext or b""
            parts.append(_U16.pack(len(ext)) + ext)
    if layout.offset:
        parts.append(_OFFSET.pack(msg.offset or 0, msg.raw_size or 0))
    parts.append(msg.body)
    return b"".join(parts)


@dataclass(frozen=True, slots=True)
class PublishResult:
    """What a traced publish (PUB_TRACE, MPUB_TRACE, PUB_EXT with ``##trace_id``) returns.

    For MPUB_TRACE the ids and offset are those of the first message and ``size`` covers the
    whole batch.

    Attributes:
        internal_id: The message's internal id in its partition (Youzan).
        trace_id: The trace id it was published with.
        offset: Its offset in the partition's queue.
        size: Bytes it (or the batch) takes in the queue.
    """

    internal_id: int
    trace_id: int
    offset: int
    size: int

    @property
    def partition(self) -> int:
        """The partition the message went to (from its internal id)."""
        return partition_of(self.internal_id)

    @property
    def message_id(self) -> bytes:
        """The 16-byte id consumers see for this message."""
        return _U64.pack(self.internal_id) + _U64.pack(self.trace_id)


def decode_publish_response(data: bytes) -> PublishResult | None:
    """``None`` for a plain ``OK``; a :class:`PublishResult` for the 30-byte traced form."""
    if data == b"OK":
        return None
    if len(data) == 30 and data[:2] == b"OK":
        return PublishResult(*_TRACED.unpack_from(data, 2))
    raise ProtocolError(f"unexpected publish response {data[:64]!r}")
