"""Incremental decoding of server frames: ``[size u32][type u32][data]``.

Feed the decoder whatever the socket produced, in any chunking; it returns every complete
frame as a ``(frame_type, data)`` tuple. Tuples rather than objects keep the consumer's hot
path free of per-frame allocations beyond the data itself.
"""

from __future__ import annotations

import struct

from smartnsq.errors import ProtocolError

FRAME_RESPONSE = 0
FRAME_ERROR = 1
FRAME_MESSAGE = 2

HEARTBEAT = b"_heartbeat_"
OK = b"OK"
CLOSE_WAIT = b"CLOSE_WAIT"

DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024

_HEAD = struct.Struct(">iI")
_unpack_head = _HEAD.unpack_from
_unpack_size = struct.Struct(">i").unpack_from

Frame = tuple[int, bytes]


Span = tuple[int, int, int]  # (frame type, start, end) of the frame data within a buffer

OK_FRAME = _HEAD.pack(4 + len(OK), FRAME_RESPONSE) + OK  # the whole frame of a plain "OK"


class FrameDecoder:
    """Splits a byte stream into frames.

    Raises :class:`~smartnsq.errors.ProtocolError` (and nothing else) on a frame that is too
    small, larger than ``max_frame_size``, or of an unknown type. After an error the decoder is
    unusable: the stream has lost its framing.
    """

    __slots__ = ("_buf", "_failed", "_need", "max_frame_size", "others")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self._buf = bytearray()  # bytes of an incomplete frame
        self._need = 8  # buffered bytes needed before parsing is worth trying
        self.max_frame_size = max_frame_size
        self._failed = False
        # How many of the spans the last feed_spans() returned are not message frames: a
        # consumer's reads are usually all messages, and 0 here lets it skip sorting them.
        self.others = 0

    def feed_spans(self, data: bytes, limit: int = -1) -> tuple[bytes, list[Span]]:
        """Buffer ``data``; return a buffer and the spans of the complete frames in it.

        The hot path for consumers: no per-frame copy, the caller slices what it needs. At
        most ``limit`` frames if ``limit >= 0``; the rest stays buffered.
        """
        if self._failed:
            raise ProtocolError("frame decoder already failed; the connection must be closed")
        buf = self._buf
        if buf:
            buf += data
            if len(buf) < self._need:  # a large frame still arriving: no copy yet
                self.others = 0
                return b"", []
            src = bytes(buf)
            buf.clear()
        else:
            src = data
        spans: list[Span] = []
        n = len(src)
        pos = 0
        others = 0
        max_size = self.max_frame_size
        while n - pos >= 8:
            size, ftype = _unpack_head(src, pos)
            if size < 4 or size > max_size:
                self._failed = True
                raise ProtocolError(
                    f"invalid frame size {size} (allowed 4..{max_size}); not an NSQ stream?"
                )
            end = pos + 4 + size
            if end > n:
                self._need = end - pos
                break
            if ftype != FRAME_MESSAGE:
                if ftype > FRAME_MESSAGE:
                    self._failed = True
                    raise ProtocolError(f"unknown frame type {ftype}")
                others += 1
            spans.append((ftype, pos + 8, end))
            pos = end
            if len(spans) == limit:
                break
        else:
            self._need = 8
        if pos < n:
            buf += src[pos:]
            if n - pos < 8:
                self._need = 8
        self.others = others
        return src, spans

    def feed(self, data: bytes, limit: int = -1) -> list[Frame]:
        """Buffer ``data`` and return the complete frames (at most ``limit`` if >= 0)."""
        src, spans = self.feed_spans(data, limit)
        return [(ftype, src[start:end]) for ftype, start, end in spans]

    def append(self, data: bytes) -> None:
        """Buffer ``data`` without parsing; pair with :meth:`next_frame`."""
        self._buf += data

    def next_frame(self) -> Frame | None:
        """Parse at most one frame from the buffer.

        During the handshake the stream may switch encoding right after a frame, so the
        connection must not parse past it.
        """
        self._need = 0
        frames = self.feed(b"", limit=1)
        return frames[0] if frames else None

    def take_remaining(self) -> bytes:
        """Remove and return buffered bytes that do not yet form a frame.

        Used when the stream switches encoding (TLS, Snappy, DEFLATE): bytes read past the
        switch belong to the new encoding.
        """
        rest = bytes(self._buf)
        self._buf.clear()
        self._need = 8
        return rest

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def lone_message(self, data: bytes) -> bool:
        """Whether ``data`` is exactly one whole message frame, with nothing buffered before
        it: an ordered partition's usual read. Its one span is then
        ``(FRAME_MESSAGE, 8, len(data))``, and the caller may skip :meth:`feed_spans`."""
        n = len(data)
        if n < 8 or self._buf or self._failed:
            return False
        size: int
        ftype: int
        size, ftype = _unpack_head(data, 0)
        return ftype == FRAME_MESSAGE and size == n - 4 and size <= self.max_frame_size


# A frame's data starts FRAME_HEAD bytes after the frame, and its size field, first, counts
# the 4-byte type field before the data too: the data of the frame whose data starts at
# ``start`` ends at ``start - SIZE_BIAS + unpack_size(src, start - FRAME_HEAD)[0]``.
FRAME_HEAD = 8
SIZE_BIAS = 4
unpack_size = _unpack_size


def data_end(src: bytes, start: int) -> int:
    """Where the data of the frame whose data starts at ``start`` in ``src`` ends (a span's
    end, for those that keep only its start)."""
    return start - SIZE_BIAS + int(_unpack_size(src, start - FRAME_HEAD)[0])


def encode_frame(frame_type: int, data: bytes) -> bytes:
    """Build a server frame (for tests and fakes)."""
    return _HEAD.pack(len(data) + 4, frame_type) + data
