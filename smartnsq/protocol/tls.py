"""TLS as bytes in, bytes out: an :class:`ssl.SSLObject` on two memory BIOs.

The connections feed it what the socket gave and send what it returns, so TLS costs two
calls into OpenSSL per read and per write and no layer of its own. asyncio's TLS transport
(``sslproto``) is Python code between the protocol and the socket on every read and write;
with one publish batch in flight it made TLS publishing a fifth slower than plain. The
blocking connection uses it too, so its socket stays non-blocking and it can poll for an
answer as it does without TLS.
"""

from __future__ import annotations

import contextlib
import ssl

# The most plaintext one TLS record holds: one read() never returns more.
_RECORD = 16 * 1024


class TLSCodec:
    """The client side of one TLS session over a byte stream."""

    __slots__ = ("_in", "_obj", "_out", "closed", "handshaken")

    def __init__(self, context: ssl.SSLContext, hostname: str | None) -> None:
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._obj = context.wrap_bio(self._in, self._out, server_hostname=hostname)
        self.handshaken = False
        self.closed = False  # the server ended the session (close_notify)

    def handshake(self, data: bytes = b"") -> bytes:
        """Feed what the server sent (nothing to start); returns what to send to it.

        :attr:`handshaken` is set once the handshake is over; then call :meth:`decrypt`
        with nothing, for whatever came along with the server's last handshake bytes.
        Raises :class:`ssl.SSLError` (a certificate that does not verify, say).
        """
        if data:
            self._in.write(data)
        try:
            self._obj.do_handshake()
        except ssl.SSLWantReadError:
            pass
        else:
            self.handshaken = True
        return self._out.read()

    def encrypt(self, data: bytes | memoryview) -> bytes:
        """``data`` as TLS records, to be sent as they are."""
        self._obj.write(data)
        return self._out.read()

    def decrypt(self, data: bytes | memoryview) -> bytes:
        """The plaintext in ``data`` and what came before it; ``b""`` while a record is
        incomplete. The server's close_notify sets :attr:`closed`: the plaintext before it
        is returned, anything after it is not.

        Raises :class:`ssl.SSLError` on bytes that are not a valid record.
        """
        if data:
            self._in.write(data)
        read, parts = self._obj.read, []
        # Stop when every byte is used rather than on SSLWantReadError: no exception in
        # the usual case, where a read ends on a record's end.
        while not self.closed and (self._in.pending or self._obj.pending()):
            try:
                part = read(_RECORD)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:  # close_notify, once ours was sent
                part = b""
            if not part:  # close_notify: nothing after it is read
                self.closed = True
                break
            parts.append(part)
        if len(parts) == 1:
            return parts[0]
        return b"".join(parts)

    @property
    def has_outgoing(self) -> bool:
        """Whether reading produced bytes for the server (a TLS 1.3 key update answer)."""
        return self._out.pending > 0

    def outgoing(self) -> bytes:
        """What is waiting to go to the server."""
        return self._out.read()

    def close(self) -> bytes:
        """The close_notify alert to send before closing the socket (``b""`` if none)."""
        # unwrap() then waits for the server's alert (SSLWantReadError): not worth waiting for.
        with contextlib.suppress(ssl.SSLError):
            self._obj.unwrap()
        return self._out.read()
