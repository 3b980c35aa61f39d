"""One blocking TCP connection to one nsqd, safe to share between threads.

The handshake is :class:`~smartnsq.protocol.handshake.Handshake`'s, driven with blocking
reads. Requests are pipelined: a thread writes its command and queues its place under the
send lock, then waits for its answer. There is no reader thread: whichever waiting thread
holds the read lock reads for everybody, handing each answer to its request in order (and
answering nsqd's heartbeats), until its own answer is there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import select
import socket
import ssl
import threading
import time
from collections import deque

from smartnsq.errors import (
    ConnectFailed,
    ConnectionClosed,
    NSQError,
    NSQTimeout,
    ProtocolError,
    closed_error,
    error_from_frame,
    unanswered_error,
)
from smartnsq.net.busy_poll import BusyPoll, cpu_yield
from smartnsq.protocol import commands
from smartnsq.protocol.frames import FRAME_ERROR, FRAME_RESPONSE, HEARTBEAT, FrameDecoder
from smartnsq.protocol.handshake import (
    Codec,
    ConnectionConfig,
    Features,
    Handshake,
    Send,
    StartTLS,
    Step,
    parse_address,
)
from smartnsq.protocol.tls import TLSCodec

# A producer only reads answers (a few bytes each). A large read size costs a fresh,
# page-faulted buffer per read: measured, it doubled a sequential publish's round trip.
_READ_SIZE = 16 * 1024
_IDLE_CHECK = 1.0  # an idle connection is polled for heartbeats (or its end) before use
_INF = float("inf")


class _Waiter:
    __slots__ = ("done", "error", "publish", "result", "sent")

    def __init__(self, publish: bool, sent: float) -> None:
        self.done = False
        self.result = b""
        self.error: BaseException | None = None
        self.publish = publish
        self.sent = sent


@dataclasses.dataclass(frozen=True)
class Detached:
    """A handshaken connection handed over by :meth:`SyncConnection.detach`: the socket
    (blocking from now on, with ``timeout``), the frame decoder holding any bytes already
    read, and the negotiated codecs (``None``: the bytes go as they are). The new owner
    closes the socket."""

    address: str
    sock: socket.socket
    decoder: FrameDecoder
    features: Features
    compress: Codec | None
    decompress: Codec | None


class SyncConnection:
    """A handshaken blocking connection. Create it with :meth:`open`."""

    def __init__(self, address: str, sock: socket.socket, config: ConnectionConfig) -> None:
        self.address = address
        self.config = config
        self.features = Features()
        self.closed = False
        self.close_reason: BaseException | None = None
        self.retiring = False  # closed (or being closed) by us, not lost
        self._sock = sock
        self._decoder = FrameDecoder(config.max_frame_size)
        self._compress: Codec | None = None
        self._decompress: Codec | None = None
        self._waiters: deque[_Waiter] = deque()
        self._send_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self.last_read = time.monotonic()
        self._send_timeout = config.handshake_timeout
        self._tls: TLSCodec | None = None
        # The codec is one OpenSSL session: a reading thread and a sending one take turns.
        self._tls_lock = threading.Lock()
        self._busy = BusyPoll(config.busy_poll)
        self._callers = 0  # threads inside request(): a retired connection closes after them
        self._callers_lock = threading.Lock()
        self._handshake_deadline = _INF
        self.clock = time.monotonic  # what the async connection's clock is to its callers

    def __repr__(self) -> str:
        return f"<SyncConnection {self.address}{' closed' if self.closed else ''}>"

    @classmethod
    def open(cls, address: str, config: ConnectionConfig, timeout: float) -> SyncConnection:
        """Connect and handshake within ``timeout`` seconds (and the config's own limits)."""
        host, port = parse_address(address)
        deadline = time.monotonic() + timeout  # the whole of it: connecting and handshake
        try:
            sock = socket.create_connection((host, port), min(timeout, config.connect_timeout))
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to nsqd {address}: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = cls(address, sock, config)
        try:
            conn._handshake_deadline = min(deadline, time.monotonic() + config.handshake_timeout)
            conn._sock.settimeout(max(0.001, conn._handshake_deadline - time.monotonic()))
            conn._handshake(host)
            conn._send_timeout = max(timeout, config.handshake_timeout)
            # Non-blocking: a timeout socket polls before every send and recv (two more
            # system calls per publish); reads wait with select(), sends only when full.
            conn._sock.setblocking(False)
        except NSQError:  # ConnectFailed is an OSError too: keep the precise error
            conn._abort(None)
            raise
        except TimeoutError:
            conn._abort(None)
            raise ConnectFailed(f"handshake with nsqd {address} timed out") from None
        except (OSError, ssl.SSLError) as exc:
            conn._abort(None)
            raise ConnectFailed(f"handshake with nsqd {address} failed: {exc!r}") from exc
        except BaseException:
            conn._abort(None)
            raise
        return conn

    def _handshake(self, host: str) -> None:
        hs = Handshake(self.address, host, self.config)
        step: Step | bytes | None = hs.start()
        while step is not None:
            if isinstance(step, bytes):  # a heartbeat to answer
                self._sock.sendall(step)
            elif isinstance(step, Send):
                self._sock.sendall(step.data)
            elif isinstance(step, StartTLS):
                self._start_tls(TLSCodec(step.context, step.hostname))
            else:
                rest = self._decoder.take_remaining()
                self._compress, self._decompress = step.compress, step.decompress
                if rest:
                    self._decoder.append(step.decompress(rest))
            step = hs.reply(*self._handshake_frame())
        self.features = hs.features

    def _start_tls(self, tls: TLSCodec) -> None:
        out = tls.handshake()
        while True:
            if out:
                self._sock.sendall(out)
            if tls.handshaken:
                break
            out = tls.handshake(self._recv_in_handshake())
        self._tls = tls
        rest = tls.decrypt(b"")  # nothing else is buffered: nsqd waits for our ClientHello
        if rest:
            self._decoder.append(rest)

    def _recv_in_handshake(self) -> bytes:
        left = self._handshake_deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self._sock.settimeout(left)  # each read gets what is left, not a fresh timeout
        data = self._sock.recv(_READ_SIZE)
        if not data:
            raise ConnectFailed(f"nsqd {self.address} closed the connection in the handshake")
        return data

    def _handshake_frame(self) -> tuple[int, bytes]:
        while True:
            frame = self._decoder.next_frame()
            if frame is not None:
                return frame
            data = self._recv_in_handshake()
            if self._tls is not None:
                data = self._tls.decrypt(data)
                if self._tls.closed and not data:
                    raise ConnectFailed(f"nsqd {self.address} closed TLS in the handshake")
            if self._decompress is not None:
                data = self._decompress(data)
            self._decoder.append(data)

    # -- requests --------------------------------------------------------------------------------

    @property
    def usable(self) -> bool:
        """Open, as far as we know; an idle one is polled first, so heartbeats that came
        meanwhile are answered and one that nsqd closed for missing them is seen closed."""
        if not self.closed and time.monotonic() - self.last_read > _IDLE_CHECK:
            self._poll()
        return not self.closed

    @property
    def pending(self) -> int:
        return len(self._waiters)

    @property
    def waiting_since(self) -> float:
        """When (``time.monotonic()``) the oldest request still awaiting an answer was
        sent; infinity when none is."""
        try:
            return self._waiters[0].sent
        except IndexError:  # none (or the last one was answered meanwhile, in another thread)
            return _INF

    def request(self, data: bytes, timeout: float, *, publish: bool = True) -> bytes:
        """Send a command that nsqd answers and return the answer's payload.

        :class:`NSQTimeout` after ``timeout`` seconds, however many threads share the
        connection; the request keeps its place (its answer, when it comes, is dropped), so
        later answers still match their requests. :class:`OutcomeUnknown`: the connection
        ended after the command was sent; :class:`ConnectionClosed`: it was closed before.
        """
        now = time.monotonic()
        deadline = now + timeout
        with self._callers_lock:
            self._callers += 1
        try:
            return self._request(data, now, deadline, publish)
        finally:
            with self._callers_lock:
                self._callers -= 1
                last = not self._callers
            if last and self.retiring and not self.closed:
                self.close(0.0)  # the last caller of a retired connection closes it

    def _request(self, data: bytes, now: float, deadline: float, publish: bool) -> bytes:
        waiter = _Waiter(publish, now)
        # Bounded: a thread whose large write waits on a stopped nsqd holds this lock.
        if not self._send_lock.acquire(timeout=max(0.0, deadline - now)):
            raise NSQTimeout(f"nsqd {self.address} did not take the command in time (not sent)")
        try:
            if self.closed:
                raise self._closed_error()
            self._waiters.append(waiter)
            # Alone in flight: poll for the answer before sleeping on it (BusyPoll).
            alone = len(self._waiters) == 1 and self._busy.limit > 0.0
            try:
                self._write(data if self._compress is None else self._compress(data), deadline)
            except OSError as exc:  # a timeout too: part of the command may be out
                self._fail(ConnectionClosed(f"writing to nsqd {self.address} failed: {exc!r}"))
            sent = time.perf_counter()
            poll = self._busy.budget(sent) if alone else 0.0
        finally:
            self._send_lock.release()
        while not waiter.done:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._read_lock.acquire(timeout=remaining):
                break
            try:
                if not waiter.done:
                    # What is left now: waiting for the lock took some of it.
                    self._read_once(deadline - time.monotonic(), poll)
                    poll = 0.0
            finally:
                self._read_lock.release()
        if alone and waiter.done:
            self._busy.observe(sent, time.perf_counter())
        if not waiter.done:
            raise NSQTimeout(f"nsqd {self.address} did not answer in time")
        if waiter.error is not None:
            raise waiter.error
        return waiter.result

    def _write(self, data: bytes, deadline: float = _INF) -> None:
        """Send all of ``data`` (under the send lock); TimeoutError if nsqd stops reading
        (for the connection's send timeout, or until ``deadline``)."""
        if self._tls is not None:
            with self._tls_lock:
                data = self._tls.encrypt(data)
        self._send_raw(data, deadline)

    def _send_raw(self, data: bytes, deadline: float = _INF) -> None:
        sock = self._sock
        try:
            sent = sock.send(data)
        except BlockingIOError:
            sent = 0
        if sent == len(data):
            return
        rest = memoryview(data)[sent:]
        deadline = min(deadline, time.monotonic() + self._send_timeout)
        while rest:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([], [sock], [], remaining)[1]:
                raise TimeoutError(f"nsqd {self.address} did not read for {self._send_timeout}s")
            with contextlib.suppress(BlockingIOError):
                rest = rest[sock.send(rest) :]

    def _poll(self) -> None:
        if self._read_lock.acquire(blocking=False):
            try:
                self._read_once(0.0)
            finally:
                self._read_lock.release()

    def _read_once(self, wait: float, poll: float = 0.0) -> None:
        """One read (waiting at most ``wait`` seconds, polling the first ``poll`` of them),
        every frame in it dealt with."""
        sock = self._sock
        if self.closed:
            return
        data = poll_recv(sock, poll) if poll > 0.0 else None
        if data is None:
            data = self._wait_recv(wait)
            if data is None:
                return
        if not data:
            self._fail(ConnectionClosed(f"nsqd {self.address} closed the connection"))
            return
        self.last_read = time.monotonic()
        try:
            tls = self._tls
            if tls is not None:
                data = self._decrypt(tls, data)
            if self._decompress is not None:
                data = self._decompress(data)
            for ftype, payload in self._decoder.feed(data):  # past the handshake: all at once
                self._on_frame(ftype, payload)
            if tls is not None and tls.closed:  # close_notify: the end, as an EOF is
                raise ConnectionClosed(f"nsqd {self.address} closed the connection")
        except NSQError as exc:  # garbage, or a fatal error frame: the connection is over
            self._fail(exc)

    def _decrypt(self, tls: TLSCodec, data: bytes) -> bytes:
        try:
            with self._tls_lock:
                data = tls.decrypt(data)
        except ssl.SSLError as exc:
            raise ConnectionClosed(f"TLS with nsqd {self.address} failed: {exc!r}") from exc
        if tls.has_outgoing:  # a TLS 1.3 key update to acknowledge
            # Under the send lock, and in the codec's order: a sender's encrypt() may have
            # taken it already, together with its own records.
            try:
                with self._send_lock:
                    with self._tls_lock:
                        answer = tls.outgoing()
                    self._send_raw(answer)
            except OSError as exc:
                raise ConnectionClosed(f"writing to nsqd {self.address} failed: {exc!r}") from exc
        return data

    def _wait_recv(self, wait: float) -> bytes | None:
        """One ``recv`` after waiting up to ``wait`` seconds; None: nothing (or it broke)."""
        sock = self._sock
        try:
            ready, _, _ = select.select([sock], [], [], wait if wait > 0.0 else 0.0)
        except (OSError, ValueError) as exc:  # closed under us
            self._fail(ConnectionClosed(f"connection to nsqd {self.address} broke: {exc!r}"))
            return None
        if not ready:
            return None
        try:
            return sock.recv(_READ_SIZE)
        except (BlockingIOError, TimeoutError):
            return None
        except OSError as exc:
            self._fail(ConnectionClosed(f"connection to nsqd {self.address} broke: {exc!r}"))
            return None

    def _on_frame(self, ftype: int, payload: bytes) -> None:
        if ftype == FRAME_RESPONSE:
            if payload == HEARTBEAT:
                nop = commands.NOP if self._compress is None else self._compress(commands.NOP)
                with self._send_lock:
                    if not self.closed:
                        try:
                            self._write(nop)
                        except OSError as exc:
                            raise ConnectionClosed(
                                f"connection to nsqd {self.address} broke: {exc!r}"
                            ) from exc
                return
            if self._waiters:
                waiter = self._waiters.popleft()
                waiter.result = payload
                waiter.done = True
            return
        if ftype != FRAME_ERROR:
            raise ProtocolError(f"nsqd {self.address} sent frame type {ftype} to a producer")
        if not self._waiters:
            err = error_from_frame(payload)
        else:
            waiter = self._waiters.popleft()
            err = error_from_frame(payload, publish=waiter.publish)
            waiter.error = err
            waiter.done = True
        if err.fatal:
            raise err

    # -- closing ---------------------------------------------------------------------------------

    def _closed_error(self) -> ConnectionClosed:
        return closed_error(self.address, self.close_reason)

    def _fail(self, reason: BaseException) -> None:
        """The connection is over: every waiting request fails (each was sent, at least in
        part: nsqd may have carried it out)."""
        self._abort(reason)
        while self._waiters:
            waiter = self._waiters.popleft()
            waiter.error = unanswered_error(self.address, reason)
            waiter.done = True

    def retire(self) -> None:
        """Send nothing more; close once no thread waits on it (each waits until its own
        deadline: an answer may still come)."""
        self.retiring = True
        with self._callers_lock:
            idle = not self._callers
        if idle:
            self.close(0.0)

    def detach(self, timeout: float) -> Detached:
        """Hand the socket over to a caller that runs its own read loop (a Spark task
        reading a range, say): no request may be pending. The connection is closed for
        this object from then on; ``timeout`` is the socket's from then on."""
        with self._send_lock:
            if self.closed:
                raise self._closed_error()
            if self._waiters:
                raise NSQError(f"connection to nsqd {self.address} has requests pending")
            self.closed = self.retiring = True
            self.close_reason = ConnectionClosed(f"connection to nsqd {self.address} handed over")
        self._sock.settimeout(timeout)
        compress, decompress, tls = self._compress, self._decompress, self._tls
        if tls is not None:  # the new owner's codecs take TLS on and off too
            compress, decompress = _sealed(compress, tls), _opened(tls, decompress)
        return Detached(
            self.address, self._sock, self._decoder, self.features, compress, decompress
        )

    def _abort(self, reason: BaseException | None) -> None:
        if not self.closed:
            self.closed = True
            self.close_reason = reason
        with contextlib.suppress(OSError):
            self._sock.close()

    def close(self, timeout: float = 5.0) -> None:
        """Wait (up to ``timeout``) for outstanding answers, then close."""
        self.retiring = True
        deadline = time.monotonic() + timeout
        while self._waiters and not self.closed and time.monotonic() < deadline:
            if self._read_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                try:
                    self._read_once(deadline - time.monotonic())
                finally:
                    self._read_lock.release()
        with self._send_lock:
            if self._tls is not None and not self.closed:
                with self._tls_lock:
                    goodbye = self._tls.close()
                with contextlib.suppress(OSError):
                    self._send_raw(goodbye)
            self._fail(ConnectionClosed(f"connection to nsqd {self.address} closed by the client"))


def _sealed(compress: Codec | None, tls: TLSCodec) -> Codec:
    if compress is None:
        return tls.encrypt
    return lambda data: tls.encrypt(compress(data))


def _opened(tls: TLSCodec, decompress: Codec | None) -> Codec:
    if decompress is None:
        return tls.decrypt
    return lambda data: decompress(tls.decrypt(data))


def poll_recv(sock: socket.socket, seconds: float) -> bytes | None:
    """``recv`` on a non-blocking socket, retried for up to ``seconds`` and giving the CPU
    away between tries; None if nothing came (or the socket failed: the caller's blocking
    read reports it)."""
    recv = sock.recv
    clock = time.perf_counter
    end = clock() + seconds
    while True:
        try:
            return recv(_READ_SIZE)
        except BlockingIOError:
            if clock() > end:
                return None
            cpu_yield()
        except OSError:
            return None
