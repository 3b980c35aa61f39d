"""The read side of a connection: bytes from the transport in, frames out.

The transport calls :meth:`FramePump.on_data` with each read (handed to it directly: no
layer in between on the hot path). It decodes frames, answers heartbeats, resolves the
oldest waiting request with each response or error frame, and hands message frames to
``on_messages`` as spans of the read buffer, without copying them.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from smartnsq.errors import ServerError, error_from_frame
from smartnsq.net.transport import Link
from smartnsq.net.waiters import Waiter
from smartnsq.protocol import commands
from smartnsq.protocol.frames import (
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT,
    OK,
    OK_FRAME,
    FrameDecoder,
    Span,
)

__all__ = ["FramePump"]

log = logging.getLogger("smartnsq.connection")  # the connection's logger: one name to set

# Failures of these commands arrive as error frames with no request waiting for them.
_ASYNC_ERRORS = (b"E_FIN_FAILED", b"E_REQ_FAILED", b"E_TOUCH_FAILED")


class FramePump:
    """Turns one connection's reads into answers and message batches.

    Args:
        address: The nsqd address, for log lines.
        link: The transport (heartbeats are answered on it).
        max_frame_size: The largest frame accepted.
        stop: Called with the error when a read is fatal (before it is raised).

    Attributes:
        decoder: The frame decoder (the handshake reads through it too).
        decompress: The negotiated decompression, or None.
        waiters: The requests awaiting an answer, oldest first.
        on_messages: Called with a buffer and the ``(frame type, start, end)`` spans of the
            message frames that arrived together in it: no copy is made until the callee
            slices what it needs, and it can account for a whole batch at once.
        on_async_error: Called with an error frame no request waits for (a failed FIN, REQ
            or TOUCH); None: logged.
        before_read: Called once per read that is not a lone answer, before its frames.
    """

    __slots__ = (
        "address",
        "before_read",
        "decoder",
        "decompress",
        "link",
        "on_async_error",
        "on_messages",
        "stop",
        "waiters",
    )

    def __init__(
        self,
        address: str,
        link: Link,
        max_frame_size: int,
        stop: Callable[[BaseException], None],
    ) -> None:
        self.address = address
        self.link = link
        self.decoder = FrameDecoder(max_frame_size)
        self.decompress: Callable[[bytes], bytes] | None = None
        self.waiters: deque[Waiter] = deque()
        self.on_messages: Callable[[bytes, list[Span]], None] | None = None
        self.on_async_error: Callable[[ServerError], None] | None = None
        self.before_read: Callable[[], None] | None = None
        self.stop = stop

    def on_data(self, data: bytes) -> None:
        """Deal with one read; a fatal error stops the connection and is raised."""
        if (  # a lone OK for the oldest request (a publisher's usual read): no decoding
            data == OK_FRAME
            and self.waiters
            and self.before_read is None
            and self.decompress is None
            and not self.decoder.buffered  # not in the middle of a frame
        ):
            waiter = self.waiters.popleft()
            waiter.resolve(OK, None)
            waiter.wake()
            return
        on_messages = self.on_messages
        if (  # one whole message frame (an ordered partition's usual read): no decoding pass
            on_messages is not None and self.decompress is None and self.decoder.lone_message(data)
        ):
            if self.before_read is not None:
                self.before_read()
            try:
                on_messages(data, [(FRAME_MESSAGE, 8, len(data))])
            except Exception as exc:
                self.stop(exc)
                raise
            return
        # Answered requests resume only after the whole read is dealt with, so a fatal
        # error in it has already marked the connection unusable when they do.
        answered: list[Waiter] = []
        try:
            self._read(data, answered)
        except Exception as exc:
            self.stop(exc)
            raise
        finally:
            for waiter in answered:
                waiter.wake()

    def _read(self, data: bytes, answered: list[Waiter]) -> None:
        if self.before_read is not None:
            self.before_read()
        if self.decompress is not None:
            data = self.decompress(data)
        decoder = self.decoder
        src, spans = decoder.feed_spans(data)
        on_messages = self.on_messages
        if not decoder.others:  # only message frames (or none): the consumer's usual read
            if spans and on_messages is not None:
                on_messages(src, spans)
            return
        batch: list[Span] = []
        for span in spans:
            ftype, start, end = span
            if ftype == FRAME_MESSAGE:
                batch.append(span)
                continue
            if batch:  # keep message and other frames in stream order
                if on_messages is not None:
                    on_messages(src, batch)
                batch = []
            if ftype == FRAME_RESPONSE:
                payload = src[start:end]
                if payload == HEARTBEAT:
                    self.link.write(commands.NOP)
                elif self.waiters:
                    waiter = self.waiters.popleft()
                    waiter.resolve(payload, None)
                    answered.append(waiter)
                else:
                    log.debug("nsqd %s: answer %r with no request", self.address, payload[:64])
            else:
                self._on_error_frame(src[start:end], answered)
        if batch and on_messages is not None:
            on_messages(src, batch)

    def _on_error_frame(self, payload: bytes, answered: list[Waiter]) -> None:
        if payload.startswith(_ASYNC_ERRORS) or not self.waiters:
            err = error_from_frame(payload)
            if self.on_async_error is not None:
                self.on_async_error(err)
            else:
                log.warning("nsqd %s: %s", self.address, err)
        else:
            waiter = self.waiters.popleft()
            err = error_from_frame(payload, publish=waiter.publish)
            waiter.resolve(b"", err)
            answered.append(waiter)
        if err.fatal:
            raise err
