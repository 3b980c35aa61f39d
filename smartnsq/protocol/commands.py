"""Encoders for every command a client sends, classic and Youzan.

Each function returns the exact bytes to write. They do not validate topic or channel names
(callers do that once, up front, with :mod:`smartnsq.protocol.names`); they do check the things
only they can see, such as the shape of a message id.

``partition`` is the Youzan fork's optional trailing argument; ``None`` leaves it out, which is
what classic nsqd expects.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from smartnsq.errors import InvalidArgument

MAGIC_V2 = b"  V2"

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_pack_u32 = _U32.pack
_pack_u64 = _U64.pack

NOP = b"NOP\n"
CLS = b"CLS\n"


def _line(name: bytes, *params: str | int | None) -> bytes:
    parts = [name]
    for p in params:
        if p is not None:
            parts.append(str(p).encode())
    return b" ".join(parts) + b"\n"


def _with_body(line: bytes, body: bytes) -> bytes:
    return b"".join((line, _pack_u32(len(body)), body))


def _check_id(message_id: bytes) -> bytes:
    if len(message_id) != 16:
        raise InvalidArgument(f"message id must be 16 bytes, got {len(message_id)}")
    return message_id


def _check_ids(ids: Sequence[bytes]) -> Sequence[bytes]:
    lengths = set(map(len, ids))  # at C speed: these run on batches of thousands
    if lengths - {16}:
        raise InvalidArgument(f"message ids must be 16 bytes, got {sorted(lengths - {16})}")
    return ids


def json_header(headers: Mapping[str, Any]) -> bytes:
    try:
        raw = json.dumps(dict(headers), separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"ext headers must be JSON-serialisable: {exc}") from None
    if len(raw) >= 0xFFFF:
        raise InvalidArgument(f"ext headers encode to {len(raw)} bytes; the limit is 65534")
    return raw


# -- session ------------------------------------------------------------------------------------


def identify(data: Mapping[str, Any]) -> bytes:
    return _with_body(b"IDENTIFY\n", json.dumps(dict(data)).encode())


def auth(secret: bytes) -> bytes:
    return _with_body(b"AUTH\n", secret)


def sub(topic: str, channel: str, partition: int | None = None) -> bytes:
    return _line(b"SUB", topic, channel, partition)


def sub_ordered(topic: str, channel: str, partition: int | None = None) -> bytes:
    return _line(b"SUB_ORDERED", topic, channel, partition)


def sub_advanced(
    topic: str, channel: str, partition: int | None = None, start: str | None = None
) -> bytes:
    """``SUB_ADVANCED``: like ``SUB``, and every message carries its queue offset and raw size.

    ``start`` (``timestamp:<unix s>``, ``virtual_queue:<offset>``, ``msgcount:<n>`` or
    ``special:-1``) asks nsqd to move the channel first, if this is its only client. Mind the
    fork's quirk: with a ``start``, nsqd ignores ``partition`` (it reads the partition only
    from a 4-token command) and picks a partition of the topic that node leads; without one,
    the partition is honoured. smartnsq's consumer sends no ``start`` for that reason.
    """
    if start is not None:
        if partition is None:
            raise InvalidArgument("SUB_ADVANCED with a start needs a partition argument before it")
        kind, _, value = start.partition(":")
        digits = value.removeprefix("-")
        if kind not in ("timestamp", "virtual_queue", "msgcount", "special") or not (
            digits.isascii() and digits.isdigit()
        ):
            raise InvalidArgument(
                f"SUB_ADVANCED start must be timestamp:<s>, virtual_queue:<offset>, "
                f"msgcount:<n> or special:-1, not {start!r}"
            )
    return _line(b"SUB_ADVANCED", topic, channel, partition, start)


def rdy(count: int) -> bytes:
    return b"RDY %d\n" % count


#: ``FIN_FORMAT % message_id`` is ``fin(message_id)`` unchecked, for the consumer's per-message
#: FIN of an id it cut from a frame itself (16 bytes by construction): no call.
FIN_FORMAT = b"FIN %s\n"


def fin(message_id: bytes) -> bytes:
    if len(message_id) != 16:  # _check_id inlined: a consumer FINs every message
        _check_id(message_id)
    return FIN_FORMAT % message_id


def req(message_id: bytes, delay_ms: int) -> bytes:
    return b"REQ " + _check_id(message_id) + b" %d\n" % max(0, int(delay_ms))


def touch(message_id: bytes) -> bytes:
    return b"TOUCH " + _check_id(message_id) + b"\n"


# Batches: one string of commands for a run of ids answered at once (handler threads, raw
# sinks, Spark readers); each equals the single commands joined. Empty for no ids.


def fins(ids: Sequence[bytes]) -> bytes:
    if not ids:
        return b""
    return b"FIN " + b"\nFIN ".join(_check_ids(ids)) + b"\n"


def reqs(ids: Sequence[bytes], delay_ms: int) -> bytes:
    if not ids:
        return b""
    tail = b" %d\n" % max(0, int(delay_ms))
    return b"REQ " + (tail + b"REQ ").join(_check_ids(ids)) + tail


def touches(ids: Sequence[bytes]) -> bytes:
    if not ids:
        return b""
    return b"TOUCH " + b"\nTOUCH ".join(_check_ids(ids)) + b"\n"


# -- publish ------------------------------------------------------------------------------------


def pub(topic: str, body: bytes, partition: int | None = None) -> bytes:
    return _with_body(_line(b"PUB", topic, partition), body)


def dpub(topic: str, delay_ms: int, body: bytes) -> bytes:
    """Deferred publish (classic nsqd only; the fork has no DPUB)."""
    return _with_body(_line(b"DPUB", topic, int(delay_ms)), body)


def mpub_body(bodies: Sequence[bytes]) -> bytes:
    count = _pack_u32(len(bodies))
    parts: list[bytes] = [count] * (2 * len(bodies) + 1)
    parts[1::2] = map(_pack_u32, map(len, bodies))
    parts[2::2] = bodies
    return b"".join(parts)


def mpub(
    topic: str, bodies: Sequence[bytes], partition: int | None = None, size: int | None = None
) -> bytes:
    """``size``: every body's length, when the caller knows they are all that long (common
    in bulk): then the whole command is one join, with no per-body work."""
    line = _line(b"MPUB", topic, partition)
    if size is not None:
        n = len(bodies)
        head = line + _pack_u32(4 + n * (4 + size)) + _pack_u32(n)
        return _pack_u32(size).join([head, *bodies])
    return _with_body(line, mpub_body(bodies))


def pub_trace(topic: str, body: bytes, trace_id: int, partition: int | None = None) -> bytes:
    return _with_body(_line(b"PUB_TRACE", topic, partition), _pack_u64(trace_id) + body)


def mpub_trace(
    topic: str, bodies: Sequence[bytes], trace_ids: Sequence[int], partition: int | None = None
) -> bytes:
    if len(bodies) != len(trace_ids):
        raise InvalidArgument(
            f"got {len(bodies)} messages but {len(trace_ids)} trace ids; give one per message"
        )
    parts = [_pack_u32(len(bodies))]
    for b, t in zip(bodies, trace_ids, strict=True):
        parts.append(_pack_u32(8 + len(b)))
        parts.append(_pack_u64(t))
        parts.append(b)
    return _with_body(_line(b"MPUB_TRACE", topic, partition), b"".join(parts))


def pub_ext(
    topic: str, body: bytes, headers: Mapping[str, Any], partition: int | None = None
) -> bytes:
    header = json_header(headers)
    return _with_body(
        _line(b"PUB_EXT", topic, partition), b"".join((_U16.pack(len(header)), header, body))
    )


def mpub_ext(
    topic: str,
    bodies: Sequence[bytes],
    headers: Sequence[Mapping[str, Any] | None],
    partition: int | None = None,
) -> bytes:
    if len(bodies) != len(headers):
        raise InvalidArgument(
            f"got {len(bodies)} messages but {len(headers)} header sets; give one per message"
        )
    parts = [_pack_u32(len(bodies))]
    for b, h in zip(bodies, headers, strict=True):
        header = json_header(h) if h else b""
        parts.append(_pack_u32(2 + len(header) + len(b)))
        parts.append(_U16.pack(len(header)))
        parts.append(header)
        parts.append(b)
    return _with_body(_line(b"MPUB_EXT", topic, partition), b"".join(parts))
