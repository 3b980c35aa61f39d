"""One TCP connection to one nsqd, on anyio (asyncio or trio).

:meth:`Connection.open` connects and handshakes (magic, IDENTIFY, TLS, Snappy or DEFLATE,
AUTH) before returning. The owner then runs :meth:`Connection.run` in its task group: the
single reader task, which answers heartbeats, matches responses to requests in order and hands
message frames to ``on_messages``.

Writes are coalesced: :meth:`queue` appends to an outgoing buffer and :meth:`flush` sends all
of it in one write, so many commands queued while a write is in progress go out together.

The parts, one module each: ``smartnsq.net.dial`` opens the connection (TCP, then the
handshake), ``smartnsq.net.frame_pump`` is the read side (frames in, answers and message batches
out), ``smartnsq.net.waiters`` the requests waiting for their answers; this module holds the
connection's state, the write path, the watchdog and closing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any

import anyio

from smartnsq.errors import (
    ConnectionClosed,
    NSQTimeout,
    ProtocolError,
    ServerError,
    closed_error,
    unanswered_error,
)
from smartnsq.net import eager
from smartnsq.net.busy_poll import BusyPoll
from smartnsq.net.dial import dial, handshake
from smartnsq.net.eager import EagerFuture
from smartnsq.net.frame_pump import FramePump
from smartnsq.net.transport import Link, running_on_asyncio
from smartnsq.net.waiters import EventWaiter, FutureWaiter, Waiter, keep_polling
from smartnsq.protocol.frames import Span
from smartnsq.protocol.handshake import ConnectionConfig, Features, parse_address

__all__ = ["Connection", "ConnectionConfig", "Features", "parse_address"]

_TICK = 0.05  # resolution of request deadlines
_INF = float("inf")


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
        on_close: Called with the connection once it has closed, or None.
        closed: Whether the connection is closed.
        close_reason: Why it closed, once it has.
    """

    def __init__(self, address: str, link: Link, config: ConnectionConfig) -> None:
        self.address = address
        self.config = config
        self.features = Features()
        self.auth: Mapping[str, Any] | None = None
        self.on_close: Callable[[Connection], None] | None = None
        self.closed = False
        self.close_reason: BaseException | None = None
        self.retiring = False  # close() was called: no new requests
        self._link = link
        # The read side; the waiting requests are its and ours (the same deque).
        self._pump = pump = FramePump(address, link, config.max_frame_size, self._stop)
        self._waiters = pump.waiters
        self._watch_idle = False  # the watchdog sleeps with no request deadline to watch
        # nsqd sends a heartbeat every interval whatever else it sends, and drops a client
        # that misses two; we give up on nsqd by the same rule, with a small margin.
        interval = config.heartbeat_interval
        self._silence_limit = interval * 2 + max(0.5, interval / 10) if interval > 0 else None
        # On asyncio: bare futures from the loop, and the loop's clock (the same one anyio
        # uses there); each get_running_loop() costs a getpid() system call on 3.11.
        self._loop = asyncio.get_running_loop() if running_on_asyncio() else None
        if self._loop is not None:
            eager.enabled()  # probed once per process: eager wake-ups, or plain futures
        self._clock = self._loop.time if self._loop is not None else anyio.current_time
        # The same clock, for a caller timing what its requests took (anyio's costs ~8x).
        self.clock: Callable[[], float] = self._clock
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

    # The read side's callbacks, set by the connection's owner.

    @property
    def on_messages(self) -> Callable[[bytes, list[Span]], None] | None:
        """Called with a read buffer and the ``(frame type, start, end)`` spans of the
        message frames that arrived together in it (no copy is made until the callee slices
        what it needs); None: messages are dropped."""
        return self._pump.on_messages

    @on_messages.setter
    def on_messages(self, callback: Callable[[bytes, list[Span]], None] | None) -> None:
        self._pump.on_messages = callback

    @property
    def on_async_error(self) -> Callable[[ServerError], None] | None:
        """Called with an error frame that no request waits for (a failed FIN, REQ or
        TOUCH); None: it is logged."""
        return self._pump.on_async_error

    @on_async_error.setter
    def on_async_error(self, callback: Callable[[ServerError], None] | None) -> None:
        self._pump.on_async_error = callback

    @property
    def before_read(self) -> Callable[[], None] | None:
        """Called once per read that carries more than a lone answer, before its frames."""
        return self._pump.before_read

    @before_read.setter
    def before_read(self, callback: Callable[[], None] | None) -> None:
        self._pump.before_read = callback

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
        host, link = await dial(address, config)
        conn = cls(address, link, config)
        pump = conn._pump
        conn.features, conn.auth, pump.decompress = await handshake(
            link, pump.decoder, address, host, config
        )
        return conn

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
                    await self._link.run(self._pump.on_data, self._tick)
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

    def _tick(self) -> float | None:
        """The watchdog, run by the link: expire requests past their deadline, give up on
        a silent server; returns the seconds until it is due again (None: stopped).

        One tick per connection is far cheaper than a timer per request.
        """
        now = self._clock()
        silence_limit = self._silence_limit
        if silence_limit is not None and now - self._link.last_read > silence_limit:
            idle = now - self._link.last_read
            what = f"no data (not even heartbeats) from nsqd {self.address} for {idle:.0f}s"
            self._stop(NSQTimeout(what))
            return None
        self._expire(now)
        if self._waiters:
            self._watch_idle = False
            return _TICK
        # Nothing to expire: sleep until a request comes (request() wakes us) or the silence
        # check is due, not _TICK: many idle connections would otherwise cost 20 wake-ups a
        # second each (200 connections: ~8 % of a core).
        self._watch_idle = True
        if silence_limit is None:
            return _INF
        return max(_TICK, self._link.last_read + silence_limit - now + _TICK)

    def _expire(self, now: float) -> None:
        """Fail the requests whose deadline has passed; they keep their place in the queue
        (their answers, when they come, are dropped)."""
        for waiter in self._waiters:
            if waiter.deadline <= now:
                waiter.set(b"", NSQTimeout(f"nsqd {self.address} did not answer in time"))

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
            OutcomeUnknown: The connection went down after the command was sent and before
                its answer came: nsqd may or may not have carried it out.
            ConnectionClosed: The connection was down before anything was sent.
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
        waiter: Waiter
        if self._loop is not None:
            waiter = FutureWaiter(EagerFuture(loop=self._loop), publish, now, deadline)
        else:
            waiter = EventWaiter(publish, now, deadline)
        self._waiters.append(waiter)
        if self._watch_idle and deadline != _INF:
            self._watch_idle = False  # it sleeps without a deadline to watch: now one
            link.wake()
        if link.must_drain:
            # The bytes are in the send buffer and will reach nsqd unless the connection
            # dies (which fails every waiter): whatever happens to this caller, the waiter
            # keeps its place so that later answers still match their requests.
            try:
                await self.flush()
            except ConnectionClosed as exc:  # part of it may be out: sent, as far as we know
                waiter.abandon()
                raise unanswered_error(self.address, exc) from exc
            except BaseException:
                waiter.abandon()
                raise
        if not (alone and self._busy.limit and isinstance(waiter, FutureWaiter)):
            return await waiter.wait()
        # Alone in flight: keep the loop polling for the answer a while (BusyPoll).
        sent = time.perf_counter()
        budget = self._busy.budget(sent)
        if budget:
            keep_polling(self._loop, waiter.future, sent + budget)
        result = await waiter.wait()
        self._busy.observe(sent, time.perf_counter())
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
        while self._waiters:  # sent (or queued to send): nsqd may have carried them out
            self._waiters.popleft().set(b"", unanswered_error(self.address, reason))
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
