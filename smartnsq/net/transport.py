"""Byte transports under :class:`~smartnsq.net.connection.Connection`.

Two implementations of one small interface:

* :class:`AsyncioLink`, used on asyncio: an :class:`asyncio.BufferedProtocol`, so incoming
  bytes are handled in the event loop's callback and writes go straight to the transport's
  buffer. This avoids a reader task switch per response and roughly doubles request/response
  rates. TLS is done inside it, by :class:`~smartnsq.protocol.tls.TLSCodec` on the plain
  transport: asyncio's TLS transport is a Python layer of its own on every read and write.
* :class:`StreamLink`, used on every other anyio backend (trio): an anyio byte stream read by
  a reader task.

Both deliver received bytes to ``on_data`` (a plain function) once the handshake is over.
Before that, :meth:`receive` reads them one chunk at a time. While running, both call the
connection's ``tick`` (its watchdog) when the seconds it last returned have passed or
:meth:`wake` is called: on asyncio from the task that waits for the close, so the watchdog
costs a connection no task and task group of its own.

Writes never block: :meth:`write` buffers, and everything written during one pass of the
event loop (many publishing tasks, the FINs for a batch of messages) goes out as one send,
compressed as a whole when compression is on. :meth:`drain` waits while the transport's
buffer is full.
"""

from __future__ import annotations

import asyncio
import mmap
import ssl
import weakref
from collections.abc import Callable
from typing import Protocol, cast

import anyio
import anyio.abc
from anyio.abc import SocketAttribute
from anyio.streams.tls import TLSStream

from smartnsq.errors import ConnectionClosed
from smartnsq.protocol.tls import TLSCodec

_READ_SIZE = 256 * 1024
_FOREVER = 1e9  # seconds

OnData = Callable[[bytes], None]
# The watchdog: does its checks, returns the seconds until it wants to run again (None: it
# stopped the connection).
Tick = Callable[[], float | None]


class Link(Protocol):
    """What a connection needs from its transport."""

    last_read: float
    compress: Callable[[bytes], bytes] | None

    @property
    def closing(self) -> bool: ...

    @property
    def must_drain(self) -> bool:
        """Whether a writer has to await :meth:`drain` (backpressure, or nothing sent yet)."""
        ...

    @property
    def local_address(self) -> str: ...

    async def receive(self) -> bytes: ...
    def write(self, data: bytes) -> None: ...
    def write_now(self, data: bytes) -> None: ...
    async def drain(self) -> None: ...
    async def start_tls(self, context: ssl.SSLContext, hostname: str) -> None: ...
    async def run(self, on_data: OnData, tick: Tick) -> None: ...
    def wake(self) -> None:
        """Call ``tick`` now rather than when it asked to be called."""
        ...

    async def flush_out(self) -> None: ...
    def abort(self) -> None: ...
    async def aclose(self) -> None: ...


def running_on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def open_link(host: str, port: int) -> Link:
    if running_on_asyncio():
        loop = asyncio.get_running_loop()
        proto = AsyncioLink(loop)
        await loop.create_connection(lambda: proto, host, port)
        return proto
    return StreamLink(await anyio.connect_tcp(host, port))


# One read buffer per event loop, shared by all its connections. A loop fills a buffer and
# calls buffer_updated() (which copies the bytes out) before it starts any other read, so one
# buffer serves them all. A buffer per connection kept the pages its largest read had touched
# resident for as long as the connection lived: several per busy connection.
_read_buffers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, memoryview] = (
    weakref.WeakKeyDictionary()
)


def read_buffer(loop: asyncio.AbstractEventLoop) -> memoryview:
    """The buffer ``loop`` reads every connection's bytes into."""
    buf = _read_buffers.get(loop)
    if buf is None:
        # Anonymous memory: pages become resident only as reads fill them (bytearray()
        # zero-fills, touching every page).
        buf = _read_buffers[loop] = memoryview(mmap.mmap(-1, _READ_SIZE))
    return buf


class AsyncioLink(asyncio.BufferedProtocol):
    # A buffered protocol: the loop reads into a buffer kept for it. A plain protocol's loop
    # calls recv(256 KiB) for every read, and allocating (then shrinking) that much for a
    # 60-byte answer or one ordered message cost a quarter of a Consumer's CPU on ordered
    # partitions (measured: 52 against 39 µs per message).
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._rbuf = read_buffer(loop)
        self._transport: asyncio.Transport | None = None
        # Only the handshake's few reads land here (a list: a deque costs 0.7 KB a connection).
        self._chunks: list[bytes] = []
        self._readable: asyncio.Future[None] | None = None
        self._on_data: OnData | None = None
        self._closed: asyncio.Future[BaseException | None] = loop.create_future()
        self._wake: asyncio.Future[None] | None = None  # run() waits on it between ticks
        self._paused = False
        self._drained: asyncio.Future[None] | None = None
        self._wbuf: list[bytes] = []
        self._flush_scheduled = False
        self._tls: TLSCodec | None = None
        self.compress: Callable[[bytes], bytes] | None = None
        self.last_read = loop.time()

    @property
    def closing(self) -> bool:
        return self._closed.done()

    @property
    def must_drain(self) -> bool:
        return self._paused

    @property
    def local_address(self) -> str:
        name = self._transport.get_extra_info("sockname") if self._transport else None
        return f"{name[0]}:{name[1]}" if name else ""

    # asyncio.Protocol callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self._transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._rbuf

    def buffer_updated(self, nbytes: int) -> None:
        self.last_read = self._loop.time()
        tls = self._tls
        if tls is None:
            # A copy: messages keep slices of what they were read from, and the buffer is
            # reused.
            self._deliver(bytes(self._rbuf[:nbytes]))
            return
        try:
            data = tls.decrypt(self._rbuf[:nbytes])
        except ssl.SSLError as exc:
            self._finish(exc)
            self.abort()
            return
        if tls.has_outgoing and self._transport is not None:
            self._transport.write(tls.outgoing())
        if data:
            self._deliver(data)
        if tls.closed:  # close_notify: the end of the stream, as an EOF is
            self._finish(None)
            if self._transport is not None:
                self._transport.close()

    def _deliver(self, data: bytes) -> None:
        on_data = self._on_data
        if on_data is None:
            self._chunks.append(data)
            if self._readable is not None and not self._readable.done():
                self._readable.set_result(None)
            return
        try:
            on_data(data)
        except Exception as exc:  # a protocol or fatal server error: the connection is over
            self._finish(exc)
            if self._transport is not None:
                self._transport.abort()

    def eof_received(self) -> bool:
        self._finish(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(exc)
        if self._readable is not None and not self._readable.done():
            self._readable.set_result(None)
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _finish(self, exc: BaseException | None) -> None:
        if not self._closed.done():
            self._closed.set_result(exc)
            self.wake()

    # Link

    async def receive(self) -> bytes:
        while not self._chunks:
            if self._closed.done():
                raise anyio.EndOfStream
            self._readable = self._loop.create_future()
            await self._readable
        return self._chunks.pop(0)

    def write(self, data: bytes) -> None:
        if self._transport is None or self._closed.done():
            raise ConnectionClosed("connection is closed")
        self._wbuf.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def write_now(self, data: bytes) -> None:
        """Write at once (after anything already buffered), without waiting for the loop."""
        transport = self._transport
        if transport is None or self._closed.done():
            raise ConnectionClosed("connection is closed")
        if self._wbuf or self.compress is not None or self._tls is not None:
            self._wbuf.append(data)
            self._flush()
        else:  # an ordered FIN's usual case
            transport.write(data)

    def _flush(self) -> None:
        self._flush_scheduled = False
        buf = self._wbuf
        if buf and self._transport is not None and not self._closed.done():
            data = buf[0] if len(buf) == 1 else b"".join(buf)
            buf.clear()
            if self.compress is not None:
                data = self.compress(data)
            if self._tls is not None:
                data = self._tls.encrypt(data)
            self._transport.write(data)

    async def drain(self) -> None:
        while self._paused and not self._closed.done():
            self._drained = self._loop.create_future()
            await self._drained

    async def start_tls(self, context: ssl.SSLContext, hostname: str) -> None:
        # Our own TLS on the plain transport (see smartnsq.protocol.tls), not loop.start_tls.
        transport = self._transport
        assert transport is not None
        codec = TLSCodec(context, hostname)
        transport.write(codec.handshake())
        while not codec.handshaken:
            try:
                data = await self.receive()
            except anyio.EndOfStream:
                raise ConnectionClosed("connection closed during the TLS upgrade") from None
            out = codec.handshake(data)
            if out:
                transport.write(out)
        # Bytes that came behind the handshake's are records already: decrypt them too.
        raw = b"".join(self._chunks)
        self._chunks.clear()
        plain = codec.decrypt(raw)
        if plain:
            self._chunks.append(plain)
        self._tls = codec
        if codec.closed:
            self._finish(None)

    async def run(self, on_data: OnData, tick: Tick) -> None:
        self._on_data = on_data
        try:
            while self._chunks:
                on_data(self._chunks.pop(0))
        except Exception:
            self.abort()
            raise
        loop, closed = self._loop, self._closed
        while not closed.done():
            wait = tick()
            if wait is None or closed.done():
                break
            wake = self._wake = loop.create_future()
            # uvloop cannot schedule at infinity (no heartbeats: only wake() will do)
            timer = loop.call_later(wait, _resolve, wake) if wait < _FOREVER else None
            try:
                await wake
            finally:
                if timer is not None:
                    timer.cancel()
                self._wake = None
        exc = await asyncio.shield(closed)
        if exc is not None:
            raise exc

    def wake(self) -> None:
        _resolve(self._wake)

    async def flush_out(self) -> None:
        """Hand everything buffered to the transport now (close() then sends it all)."""
        self._flush()
        await self.drain()

    def abort(self) -> None:
        self._finish(None)
        if self._transport is not None:
            self._transport.abort()

    async def aclose(self) -> None:
        self._finish(None)
        transport = self._transport
        if transport is not None:
            if self._tls is not None and not transport.is_closing():
                transport.write(self._tls.close())
            transport.close()


def _resolve(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


class StreamLink:
    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self._stream = stream
        self._out: list[bytes] = []
        self._lock = anyio.Lock()
        self._dirty = anyio.Event()
        self._wake = anyio.Event()
        self._closing = False
        self.compress: Callable[[bytes], bytes] | None = None
        self.last_read = anyio.current_time()

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def must_drain(self) -> bool:
        return bool(self._out)  # drain() is what sends

    @property
    def local_address(self) -> str:
        try:
            name = self._stream.extra(SocketAttribute.local_address)
        except anyio.TypedAttributeLookupError:
            return ""
        return f"{name[0]}:{name[1]}" if isinstance(name, tuple) else str(name)

    async def receive(self) -> bytes:
        data = await self._stream.receive(_READ_SIZE)
        self.last_read = anyio.current_time()
        return data

    def write(self, data: bytes) -> None:
        if self._closing:
            raise ConnectionClosed("connection is closed")
        self._out.append(data)
        self._dirty.set()

    write_now = write

    async def drain(self) -> None:
        if not self._out:
            return
        async with self._lock:
            out = self._out
            if not out:
                return
            data = out[0] if len(out) == 1 else b"".join(out)
            out.clear()
            if self.compress is not None:
                data = self.compress(data)
            # A send cut short by a cancelled caller could leave half a command on the wire
            # (and the compressor's state ahead of it): once taken, the bytes go out whole.
            # Closing the stream still ends a send that nsqd never reads.
            with anyio.CancelScope(shield=True):
                await self._stream.send(data)

    async def start_tls(self, context: ssl.SSLContext, hostname: str) -> None:
        self._stream = await TLSStream.wrap(
            self._stream, hostname=hostname, ssl_context=context, standard_compatible=False
        )

    async def _writer(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty = anyio.Event()
            await self.drain()

    async def _watch(self, tick: Tick) -> None:
        while (wait := tick()) is not None:
            self._wake = anyio.Event()
            with anyio.move_on_after(wait):
                await self._wake.wait()

    def wake(self) -> None:
        self._wake.set()

    async def run(self, on_data: OnData, tick: Tick) -> None:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._writer)
                tg.start_soon(self._watch, tick)
                while True:
                    try:
                        data = await self._stream.receive(_READ_SIZE)
                    except anyio.EndOfStream:  # not out of the task group: it would be wrapped
                        break
                    self.last_read = anyio.current_time()
                    on_data(data)
                tg.cancel_scope.cancel()
        finally:
            self._closing = True

    async def flush_out(self) -> None:
        await self.drain()

    def abort(self) -> None:
        self._closing = True
        self._out.clear()

    async def aclose(self) -> None:
        self._closing = True
        with anyio.CancelScope(shield=True):
            await self._stream.aclose()
