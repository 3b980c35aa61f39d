"""One TCP connection to one nsqd, on anyio (asyncio or trio).

:meth:`Connection.open` connects and handshakes (magic, IDENTIFY, TLS, Snappy or DEFLATE,
AUTH) before returning. The owner then runs :meth:`Connection.run` in its task group: the
single reader task, which answers heartbeats, matches responses to requests in order and hands
message frames to ``on_messages``.

Writes are coalesced: :meth:`queue` appends to an outgoing buffer and :meth:`flush` sends all
of it in one write, so many commands queued while a write is in progress go out together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

from smartnsq import eager
from smartnsq.busy_poll import LOOP_YIELD_AFTER, BusyPoll, cpu_yield
from smartnsq.eager import EagerFuture
from smartnsq.errors import (
    ConnectFailed,
    ConnectionClosed,
    NSQError,
    NSQTimeout,
    ProtocolError,
    ServerError,
    closed_error,
    error_from_frame,
)
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
from smartnsq.protocol.handshake import (
    ConnectionConfig,
    Features,
    Handshake,
    Send,
    StartTLS,
    Step,
    parse_address,
)
from smartnsq.transport import Link, open_link, running_on_asyncio

__all__ = ["Connection", "ConnectionConfig", "Features", "parse_address"]

log = logging.getLogger("smartnsq.connection")

# Failures of these commands arrive as error frames with no request waiting for them.
_ASYNC_ERRORS = (b"E_FIN_FAILED", b"E_REQ_FAILED", b"E_TOUCH_FAILED")
_TICK = 0.05  # resolution of request deadlines
_INF = float("inf")


class _EventWaiter:
    """Waits for one answer on any anyio backend."""

    __slots__ = ("deadline", "error", "event", "publish", "result", "sent")

    def __init__(self, publish: bool, sent: float, deadline: float) -> None:
        self.event = anyio.Event()
        self.result = b""
        self.error: BaseException | None = None
        self.publish = publish
        self.sent = sent
        self.deadline = deadline

    def set(self, result: bytes, error: BaseException | None) -> None:
        if self.event.is_set():  # already expired
            return
        self.result = result
        self.error = error
        self.event.set()

    resolve = set

    def wake(self) -> None:
        pass

    def abandon(self) -> None:
        """Nobody waits any more: the answer, when it comes, is dropped."""
        self.event.set()

    async def wait(self) -> bytes:
        await self.event.wait()
        if self.error is not None:
            raise self.error
        return self.result


class _FutureWaiter:
    """Waits for one answer on asyncio (uvloop included), with an eager future."""

    __slots__ = ("deadline", "future", "publish", "sent")

    def __init__(self, future: EagerFuture, publish: bool, sent: float, deadline: float) -> None:
        self.future = future
        self.publish = publish
        self.sent = sent
        self.deadline = deadline

    def set(self, result: bytes, error: BaseException | None) -> None:
        self.future.resolve(result, error)
        self.future.wake()

    def resolve(self, result: bytes, error: BaseException | None) -> None:
        self.future.resolve(result, error)

    def wake(self) -> None:
        self.future.wake()

    def abandon(self) -> None:
        """Nobody waits any more: the answer, when it comes, is dropped (never raised)."""
        self.future.cancel()

    def wait(self) -> Awaitable[bytes]:
        return self.future  # awaited directly: no coroutine frame in between


_Waiter = _EventWaiter | _FutureWaiter


def _keep_polling(loop: Any, future: asyncio.Future[bytes], until: float, calm: float) -> None:
    """Until ``future`` is done or the time is up: with a callback always ready, each pass
    of the loop polls its sockets without sleeping; from ``calm`` on, each pass also gives
    the CPU away."""
    if future.done():
        return
    now = time.perf_counter()
    if now < until:
        if now > calm:
            cpu_yield()
        loop.call_soon(_keep_polling, loop, future, until, calm)


class Connection:
    """A handshaken connection to one nsqd. Create it with [`open`][smartnsq.Connection.open].

    Run [`run`][smartnsq.Connection.run] in a task group: it reads frames, answers
    heartbeats and matches answers to requests:

        from smartnsq.protocol import commands

        conn = await Connection.open("127.0.0.1:4150")
        async with anyio.create_task_group() as tg:
            tg.start_soon(conn.run)
            await conn.request(commands.pub("events", b"hello"), publish=True)
            await conn.close()

    Args:
        address: The nsqd address (``host:port``).
        link: The transport, already connected (``open`` makes it).
        config: The settings to handshake with.

    Attributes:
        address: The nsqd address (``host:port``).
        config: The settings it was opened with.
        features: What nsqd agreed to in IDENTIFY.
        auth: nsqd's answer to AUTH (identity and permissions), or None.
        on_messages: Called with a read buffer and the ``(frame type, start, end)`` spans of
            the message frames in it.
        closed: Whether the connection is closed.
        close_reason: Why it closed, once it has.
    """

    def __init__(self, address: str, link: Link, config: ConnectionConfig) -> None:
        self.address = address
        self.config = config
        self.features = Features()
        self.auth: Mapping[str, Any] | None = None
        # Called with a buffer and the (frame type, start, end) spans of the message frames
        # that arrived together in it: no copy is made until the callee slices what it
        # needs, and the callee can account for a whole batch at once.
        self.on_messages: Callable[[bytes, list[Span]], None] | None = None
        self.on_async_error: Callable[[ServerError], None] | None = None
        self.on_close: Callable[[Connection], None] | None = None
        self.before_read: Callable[[], None] | None = None
        self.closed = False
        self.close_reason: BaseException | None = None
        self.retiring = False  # close() was called: no new requests
        self._link = link
        self._decoder = FrameDecoder(config.max_frame_size)
        self._decompress: Callable[[bytes], bytes] | None = None
        self._waiters: deque[_Waiter] = deque()
        self._watchdog_wake: anyio.Event | None = None  # set while the watchdog idles
        # On asyncio: bare futures from the loop, and the loop's clock (the same one anyio
        # uses there); each get_running_loop() costs a getpid() system call on 3.11.
        self._loop = asyncio.get_running_loop() if running_on_asyncio() else None
        if self._loop is not None:
            eager.enabled()  # probed once per process: eager wake-ups, or plain futures
        self._clock = self._loop.time if self._loop is not None else anyio.current_time
        self._scope: anyio.CancelScope | None = None
        self._stop_reason: BaseException | None = None
        # Polling needs a loop that a ready callback keeps from sleeping: asyncio's.
        self._busy = BusyPoll(config.busy_poll if self._loop is not None else 0.0)

    def __repr__(self) -> str:
        return f"<Connection {self.address}{' closed' if self.closed else ''}>"

    @property
    def local_address(self) -> str:
        """``host:port`` of our end of the connection."""
        return self._link.local_address

    @property
    def last_read(self) -> float:
        """Event-loop time of the last bytes received."""
        return self._link.last_read

    # -- opening ---------------------------------------------------------------------------------

    @classmethod
    async def open(cls, address: str, config: ConnectionConfig | None = None) -> Connection:
        """Connect to ``address`` and complete the handshake (IDENTIFY, TLS, compression, AUTH).

        Args:
            address: ``host:port`` of an nsqd's TCP port (``[v6]:port`` too).
            config: The settings; default: ``ConnectionConfig()``.

        Returns:
            The connection, ready for [`run`][smartnsq.Connection.run].

        Raises:
            ConnectFailed: The connection or the handshake failed or timed out
                ([`InsecureAuth`][smartnsq.errors.InsecureAuth] when AUTH would go out
                unencrypted with ``auth_over_plaintext=False``).
            ServerError: nsqd refused IDENTIFY or AUTH.
            ProtocolError: The peer does not speak NSQ.
            InvalidArgument: ``address`` is not a valid ``host:port``.
        """
        config = config or ConnectionConfig()
        host, port = parse_address(address)
        try:
            with anyio.fail_after(config.connect_timeout):
                link = await open_link(host, port)
        except TimeoutError:
            raise ConnectFailed(
                f"connecting to nsqd {address} timed out after {config.connect_timeout}s"
            ) from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to nsqd {address}: {exc}") from exc
        conn = cls(address, link, config)
        try:
            with anyio.fail_after(config.handshake_timeout):
                await conn._handshake(host)
        except TimeoutError:
            await link.aclose()
            raise ConnectFailed(
                f"handshake with nsqd {address} timed out after {config.handshake_timeout}s"
            ) from None
        except NSQError:  # ConnectFailed is an OSError too: keep the precise error
            await link.aclose()
            raise
        except (OSError, anyio.EndOfStream, anyio.BrokenResourceError, ssl.SSLError) as exc:
            await link.aclose()
            raise ConnectFailed(f"handshake with nsqd {address} failed: {exc!r}") from exc
        except BaseException:
            await link.aclose()
            raise
        return conn

    async def _handshake(self, host: str) -> None:
        hs = Handshake(self.address, host, self.config)
        step: Step | bytes | None = hs.start()
        while step is not None:
            if isinstance(step, bytes):  # a heartbeat to answer
                self._link.write(step)
                await self._link.drain()
            elif isinstance(step, Send):
                self._link.write(step.data)
                await self._link.drain()
            elif isinstance(step, StartTLS):
                await self._link.start_tls(step.context, step.hostname)
            else:
                rest = self._decoder.take_remaining()
                self._link.compress, self._decompress = step.compress, step.decompress
                if rest:
                    self._decoder.append(step.decompress(rest))
            step = hs.reply(*await self._next_frame())
        self.features, self.auth = hs.features, hs.auth

    async def _next_frame(self) -> tuple[int, bytes]:
        while True:
            frame = self._decoder.next_frame()
            if frame is not None:
                return frame
            data = await self._link.receive()
            if self._decompress is not None:
                data = self._decompress(data)
            self._decoder.append(data)

    # -- running ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Deliver incoming frames until the connection closes, for whatever reason.

        Whether it ends by itself, by [`close`][smartnsq.Connection.close] or by a cancelled
        caller, the connection is shut down (socket closed, waiting requests failed) before
        it returns.
        """
        reason: BaseException | None = None
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                if self.closed:
                    scope.cancel()
                try:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._watchdog)
                        await self._link.run(self._on_data)
                        tg.cancel_scope.cancel()
                except anyio.EndOfStream:
                    pass
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                    reason = ConnectionClosed(f"connection to nsqd {self.address} broke: {exc!r}")
                except (ProtocolError, ServerError, ConnectionClosed) as exc:
                    reason = exc
                except BaseExceptionGroup as group:
                    reason = group.exceptions[0]
        finally:
            reason = self._stop_reason or reason
            with anyio.CancelScope(shield=True):
                await self._shutdown(
                    reason or ConnectionClosed(f"nsqd {self.address} closed the connection")
                )

    async def _watchdog(self) -> None:
        """Expire requests past their deadline; give up on a silent server.

        One ticking task per connection is far cheaper than a timer per request.
        """
        interval = self.config.heartbeat_interval
        # nsqd sends a heartbeat every interval whatever else it sends, and drops a client
        # that misses two; we give up on nsqd by the same rule, with a small margin.
        silence_limit = interval * 2 + max(0.5, interval / 10) if interval > 0 else None
        while True:
            if self._waiters:
                await anyio.sleep(_TICK)
            else:
                # Nothing to expire: sleep until a request comes (request() wakes us) or the
                # silence check is due, not _TICK: many idle connections would otherwise
                # cost 20 wake-ups a second each (200 connections: ~8 % of a core).
                wake = self._watchdog_wake = anyio.Event()
                wait = math.inf
                if silence_limit is not None:
                    wait = self._link.last_read + silence_limit - self._clock() + _TICK
                with anyio.move_on_after(max(_TICK, wait)):
                    await wake.wait()
                self._watchdog_wake = None
            now = self._clock()
            if silence_limit is not None and now - self._link.last_read > silence_limit:
                idle = now - self._link.last_read
                self._stop(
                    NSQTimeout(
                        f"no data (not even heartbeats) from nsqd {self.address} for {idle:.0f}s"
                    )
                )
                return
            self._expire(now)

    def _expire(self, now: float) -> None:
        """Fail the requests whose deadline has passed; they keep their place in the queue
        (their answers, when they come, are dropped)."""
        for waiter in self._waiters:
            if waiter.deadline <= now:
                waiter.set(b"", NSQTimeout(f"nsqd {self.address} did not answer in time"))

    def _on_data(self, data: bytes) -> None:
        if (  # a lone OK for the oldest request (a publisher's usual read): no decoding
            data == OK_FRAME
            and self._waiters
            and self.before_read is None
            and self._decompress is None
            and not self._decoder.buffered  # not in the middle of a frame
        ):
            waiter = self._waiters.popleft()
            waiter.resolve(OK, None)
            waiter.wake()
            return
        on_messages = self.on_messages
        if (  # one whole message frame (an ordered partition's usual read): no decoding pass
            on_messages is not None
            and self._decompress is None
            and self._decoder.lone_message(data)
        ):
            if self.before_read is not None:
                self.before_read()
            try:
                on_messages(data, [(FRAME_MESSAGE, 8, len(data))])
            except Exception as exc:
                self._stop(exc)
                raise
            return
        # Answered requests resume only after the whole read is dealt with, so a fatal
        # error in it has already marked the connection unusable when they do.
        answered: list[_Waiter] = []
        try:
            self._read(data, answered)
        except Exception as exc:
            self._stop(exc)
            raise
        finally:
            for waiter in answered:
                waiter.wake()

    def _read(self, data: bytes, answered: list[_Waiter]) -> None:
        if self.before_read is not None:
            self.before_read()
        if self._decompress is not None:
            data = self._decompress(data)
        decoder = self._decoder
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
                    self._link.write(commands.NOP)
                elif self._waiters:
                    waiter = self._waiters.popleft()
                    waiter.resolve(payload, None)
                    answered.append(waiter)
                else:
                    log.debug("nsqd %s: answer %r with no request", self.address, payload[:64])
            else:
                self._on_error_frame(src[start:end], answered)
        if batch and on_messages is not None:
            on_messages(src, batch)

    def _on_error_frame(self, payload: bytes, answered: list[_Waiter]) -> None:
        if payload.startswith(_ASYNC_ERRORS) or not self._waiters:
            err = error_from_frame(payload)
            if self.on_async_error is not None:
                self.on_async_error(err)
            else:
                log.warning("nsqd %s: %s", self.address, err)
        else:
            waiter = self._waiters.popleft()
            err = error_from_frame(payload, publish=waiter.publish)
            waiter.resolve(b"", err)
            answered.append(waiter)
        if err.fatal:
            raise err

    # -- writing ---------------------------------------------------------------------------------

    @property
    def raw_write(self) -> Callable[[bytes], None]:
        """The transport's buffered write, for hot paths that already know the connection
        is up; it raises ``ConnectionClosed`` once the transport is going down."""
        return self._link.write

    @property
    def raw_write_now(self) -> Callable[[bytes], None]:
        """Like :attr:`raw_write`, but handed to the transport at once instead of coalesced
        with later writes in the same loop pass: for answers nothing else will follow."""
        return self._link.write_now

    def queue(self, data: bytes) -> None:
        """Send a command soon, coalesced with others; never blocks.

        Args:
            data: The encoded command.

        Raises:
            ConnectionClosed: The connection is (going) down.
        """
        if self.closed:
            raise self._closed_error()
        self._link.write(data)  # raises ConnectionClosed itself when the link is going down

    async def flush(self) -> None:
        """Wait until the transport has room for more (backpressure).

        Raises:
            ConnectionClosed: The connection is (going) down, or writing failed.
        """
        if self.closed or self._link.closing:
            raise self._closed_error()
        try:
            await self._link.drain()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            err = ConnectionClosed(f"writing to nsqd {self.address} failed: {exc!r}")
            self._stop(err)
            raise err from exc

    async def send(self, data: bytes) -> None:
        """Queue ``data`` and wait for transport buffer space.

        Args:
            data: The encoded command.

        Raises:
            ConnectionClosed: The connection is (going) down, or writing failed.
        """
        self.queue(data)
        await self.flush()

    async def request(
        self, data: bytes, *, publish: bool = False, timeout: float | None = None
    ) -> bytes:
        """Send a command that nsqd answers, and return the answer's payload.

        Answers arrive in request order. A request that times out or whose caller is
        cancelled stays queued, so later answers still match their requests.

        Args:
            data: The encoded command.
            publish: Whether it is a publish (changes how the Youzan fork's leader errors
                are treated: not fatal on publish).
            timeout: Seconds to wait for the answer; None waits as long as the connection
                lives.

        Returns:
            The payload of nsqd's response frame (``b"OK"`` for most commands).

        Raises:
            NSQTimeout: No answer within ``timeout``.
            ServerError: nsqd answered with an error frame.
            ConnectionClosed: The connection is or went down.
        """
        if not self.usable:
            raise self._closed_error()
        link = self._link
        alone = not self._waiters
        if alone:
            link.write_now(data)  # nothing to wait for: save a loop iteration
        else:
            link.write(data)  # coalesced with the other requests of this loop pass
        # Sent (or queued): what follows overlaps with nsqd's work. No answer can be
        # handled before this task yields, so the waiter is queued in time.
        now = self._clock()  # read once: the deadline, and the age waiting_since reports
        deadline = _INF if timeout is None else now + timeout
        waiter: _Waiter
        if self._loop is not None:
            waiter = _FutureWaiter(EagerFuture(loop=self._loop), publish, now, deadline)
        else:
            waiter = _EventWaiter(publish, now, deadline)
        self._waiters.append(waiter)
        if self._watchdog_wake is not None and deadline != _INF:
            self._watchdog_wake.set()  # it sleeps without a deadline to watch: now one
            self._watchdog_wake = None
        if link.must_drain:
            # The bytes are in the send buffer and will reach nsqd unless the connection
            # dies (which fails every waiter): whatever happens to this caller, the waiter
            # keeps its place so that later answers still match their requests.
            try:
                await self.flush()
            except BaseException:
                waiter.abandon()
                raise
        if not (alone and self._busy.limit and isinstance(waiter, _FutureWaiter)):
            return await waiter.wait()
        # Alone in flight: keep the loop polling for the answer a while (BusyPoll).
        sent = time.perf_counter()
        budget = self._busy.budget()
        if budget:
            _keep_polling(self._loop, waiter.future, sent + budget, sent + LOOP_YIELD_AFTER)
        result = await waiter.wait()
        self._busy.observe(time.perf_counter() - sent)
        return result

    @property
    def usable(self) -> bool:
        """Open, and not known to be going down."""
        return not self.closed and not self.retiring and not self._link.closing

    @property
    def pending(self) -> int:
        """Requests sent and not answered yet."""
        return len(self._waiters)

    @property
    def waiting_since(self) -> float:
        """When (this connection's clock: the event loop's) the oldest request still
        awaiting an answer was sent; infinity when none is."""
        waiters = self._waiters
        return waiters[0].sent if waiters else _INF

    # -- closing ---------------------------------------------------------------------------------

    def _closed_error(self) -> ConnectionClosed:
        return closed_error(self.address, self.close_reason)

    def _stop(self, reason: BaseException, graceful: bool = False) -> None:
        """Make :meth:`run` end with ``reason``; ``graceful`` keeps buffered writes."""
        if self._stop_reason is None:
            self._stop_reason = reason
        if not graceful:
            self._link.abort()
        if self._scope is not None:
            self._scope.cancel()

    async def _shutdown(self, reason: BaseException) -> None:
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        while self._waiters:
            err = self._closed_error()
            err.__cause__ = reason
            self._waiters.popleft().set(b"", err)
        await self._link.aclose()
        if self.on_close is not None:
            self.on_close(self)

    async def close(self, timeout: float = 5.0) -> None:
        """Wait (up to ``timeout``) for outstanding answers, send what is queued, close.

        Args:
            timeout: Seconds to wait for outstanding answers, default 5.0.
        """
        if self.closed:
            return
        self.retiring = True
        with anyio.move_on_after(timeout):
            while self._waiters and not self.closed:
                await anyio.sleep(0.005)
        if not self.closed and not self._link.closing:
            with anyio.move_on_after(max(timeout, 1.0)):
                with contextlib.suppress(ConnectionClosed, OSError, anyio.BrokenResourceError):
                    await self._link.flush_out()
        reason = ConnectionClosed(f"connection to nsqd {self.address} closed by the client")
        self._stop(reason, graceful=True)
        if self._scope is None:  # run() never started
            await self._shutdown(self._stop_reason or ConnectionClosed("closed"))
