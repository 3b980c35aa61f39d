"""Run consumers and producers until SIGINT or SIGTERM, then stop them gracefully.

::

    consumer = Consumer("events", "archive", handle, lookupd_http_addresses=[...])
    smartnsq.run(consumer)  # returns after Ctrl-C or SIGTERM, nothing left in flight

:func:`run` starts an event loop; :func:`serve` is the same for code that has one.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc

from smartnsq.consumer import Consumer
from smartnsq.errors import InvalidArgument, InvalidType
from smartnsq.producer import Producer

__all__ = ["DEFAULT_SIGNALS", "run", "serve"]

log = logging.getLogger("smartnsq.runner")

Main = Callable[[], Awaitable[object]]

DEFAULT_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)
_BACKENDS = ("asyncio", "trio")
_UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}


def run(
    *clients: Consumer | Producer,
    main: Main | None = None,
    stop_timeout: float = 10.0,
    signals: Iterable[int] = DEFAULT_SIGNALS,
    backend: str = "asyncio",
    backend_options: Mapping[str, Any] | None = None,
) -> None:
    """Run ``clients`` in a new event loop until a signal arrives, then stop them gracefully.

    Blocks; returns normally (so the process exits with status 0 and Ctrl-C prints no
    traceback) once everything is stopped. See [`serve`][smartnsq.serve] for what happens in
    between.

    Args:
        *clients: [`Consumer`][smartnsq.Consumer] and [`Producer`][smartnsq.Producer]
            instances, each passed once, not started yet.
        main: An async function taking no arguments that runs alongside (say, a publishing
            loop); its return ends the run, and its exception is re-raised after the stop.
        stop_timeout: Seconds running handlers get to finish once the stop begins (>= 0),
            default 10.0.
        signals: The signals that stop the run, default SIGINT and SIGTERM; ``()`` for none
            (required outside the main thread).
        backend: ``"asyncio"`` (default) or ``"trio"``.
        backend_options: Passed to ``anyio.run``, for example ``{"use_uvloop": True}``.

    Raises:
        InvalidArgument: A client passed twice, a negative ``stop_timeout``, an unknown
            backend, or signals outside the main thread.
        InvalidType: Something that is not a Consumer or Producer, or ``main()`` passed
            instead of ``main``.
    """
    plan = _plan(clients, main, stop_timeout, signals)
    if not isinstance(backend, str) or backend not in _BACKENDS:
        raise InvalidArgument(f"backend must be one of {_BACKENDS}, not {backend!r}")
    if backend_options is not None and not isinstance(backend_options, Mapping):
        raise InvalidType(f"backend_options must be a mapping or None, not {backend_options!r}")
    anyio.run(plan.serve, backend=backend, backend_options=dict(backend_options or {}))


async def serve(
    *clients: Consumer | Producer,
    main: Main | None = None,
    stop_timeout: float = 10.0,
    signals: Iterable[int] = DEFAULT_SIGNALS,
) -> None:
    """Run ``clients`` (Consumer and Producer instances) until told to stop.

    Producers are started first, then consumers; ``main`` (an async function taking no
    arguments, say a publishing loop) runs alongside. The run ends on the first of: one of
    ``signals`` arriving, ``main`` returning or raising, every consumer having stopped (a
    handler may call [`Consumer.stop`][smartnsq.Consumer.stop]), or ``serve`` being
    cancelled. Then:

    1. every consumer stops gracefully and concurrently: RDY 0 and
       CLS, messages not yet handed to the handler are requeued at once, running handlers get
       up to ``stop_timeout`` seconds to finish (after that they are cancelled and their
       messages requeued);
    2. ``main``, if still running, is cancelled;
    3. producers are closed last, so that handlers can publish while they finish.

    Another signal during the stop cuts the wait for running handlers short. The stop itself
    is shielded from cancellation, so nsqd gets an answer for every message held. An
    exception raised by ``main`` is re-raised once everything is stopped. Pass
    ``signals=()`` to handle no signal (required outside the main thread).

    A message that a handler kept with ``disable_auto_response()`` and left unanswered after
    returning is not requeued by the stop: it stays in flight until nsqd's message timeout.

    Args:
        *clients: [`Consumer`][smartnsq.Consumer] and [`Producer`][smartnsq.Producer]
            instances, each passed once, not started yet.
        main: An async function taking no arguments that runs alongside.
        stop_timeout: Seconds running handlers get to finish once the stop begins (>= 0),
            default 10.0.
        signals: The signals that stop the run, default SIGINT and SIGTERM; ``()`` for none.

    Raises:
        InvalidArgument: A client passed twice, a negative ``stop_timeout``, or signals
            outside the main thread.
        InvalidType: Something that is not a Consumer or Producer, or ``main()`` passed
            instead of ``main``.
    """
    await _plan(clients, main, stop_timeout, signals).serve()


@dataclass(frozen=True, slots=True)
class _Plan:
    consumers: tuple[Consumer, ...]
    producers: tuple[Producer, ...]
    main: Main | None
    stop_timeout: float
    signals: tuple[signal.Signals, ...]

    async def serve(self) -> None:
        stopping = anyio.Event()
        # main's exception, or a client's failure to start: re-raised as is after the stop,
        # not wrapped in the task group's exception group.
        failure: list[Exception] = []
        async with anyio.create_task_group() as outer:
            # Cancelling serve() is a stop request like a signal; the stop below is shielded
            # so that it can still answer nsqd for the messages it holds.
            await outer.start(_stop_when_cancelled, stopping)
            with anyio.CancelScope(shield=True):
                try:
                    await self._lifecycle(stopping, failure)
                except Exception as exc:
                    failure.append(exc)
            outer.cancel_scope.cancel()
        if failure:
            raise failure[0]

    async def _lifecycle(self, stopping: anyio.Event, failure: list[Exception]) -> None:
        async with contextlib.AsyncExitStack() as stack:
            # Opened before the clients start: a signal that arrives meanwhile waits here.
            receiver = None
            if self.signals:
                receiver = stack.enter_context(anyio.open_signal_receiver(*self.signals))
            # Entered first, left last: producers outlive the consumers' handlers.
            for producer in self.producers:
                await stack.enter_async_context(producer)
            for consumer in self.consumers:
                await stack.enter_async_context(consumer)
            async with anyio.create_task_group() as tg:
                if receiver is not None:
                    tg.start_soon(self._watch_signals, receiver, stopping, tg)
                if self.main is not None:
                    tg.start_soon(_run_main, self.main, stopping, failure)
                if self.consumers:
                    tg.start_soon(_watch_consumers, self.consumers, stopping)
                await stopping.wait()
                async with anyio.create_task_group() as stoppers:
                    for consumer in self.consumers:
                        stoppers.start_soon(consumer.stop, self.stop_timeout)
                tg.cancel_scope.cancel()  # main and the watchers
            # The exit stack now leaves the (stopped) consumers, then closes the producers.

    async def _watch_signals(
        self,
        receiver: AsyncIterator[signal.Signals],
        stopping: anyio.Event,
        tg: anyio.abc.TaskGroup,
    ) -> None:
        async for signum in receiver:
            name = signal.Signals(signum).name
            if not stopping.is_set():
                log.info("%s received: stopping (send it again to stop at once)", name)
                stopping.set()
                continue
            log.warning("%s received while stopping: cancelling running handlers", name)
            for consumer in self.consumers:
                # A second stop() cuts the first one's wait short; both then end together.
                tg.start_soon(consumer.stop, 0)


async def _stop_when_cancelled(
    stopping: anyio.Event, *, task_status: anyio.abc.TaskStatus[None]
) -> None:
    try:
        task_status.started()
        await anyio.sleep_forever()
    finally:
        stopping.set()


async def _run_main(main: Main, stopping: anyio.Event, failure: list[Exception]) -> None:
    try:
        result = main()
        if not inspect.isawaitable(result):
            raise InvalidType(f"main must be an async function; it returned {result!r}")
        await result
    except Exception as exc:
        failure.append(exc)
    finally:
        stopping.set()


async def _watch_consumers(consumers: tuple[Consumer, ...], stopping: anyio.Event) -> None:
    async with anyio.create_task_group() as tg:
        for consumer in consumers:
            tg.start_soon(consumer.wait_stopped)
    stopping.set()


def _plan(
    clients: tuple[object, ...], main: object, stop_timeout: object, signals: object
) -> _Plan:
    consumers: list[Consumer] = []
    producers: list[Producer] = []
    for client in clients:
        if isinstance(client, Consumer):
            consumers.append(client)
        elif isinstance(client, Producer):
            producers.append(client)
        else:
            raise InvalidType(f"run() takes Consumer and Producer instances, not {client!r}")
    if len({id(c) for c in clients}) != len(clients):
        raise InvalidArgument("each client may be passed to run() only once")
    if inspect.iscoroutine(main):
        main.close()  # the caller's coroutine would otherwise warn that it was never awaited
        raise InvalidType("main must be an async function, not a coroutine: pass main, not main()")
    if main is not None and not callable(main):
        raise InvalidType(f"main must be an async function taking no arguments, not {main!r}")
    if isinstance(stop_timeout, bool) or not isinstance(stop_timeout, int | float):
        raise InvalidType(f"stop_timeout must be a number of seconds, not {stop_timeout!r}")
    if not 0 <= stop_timeout < math.inf:
        raise InvalidArgument(f"stop_timeout must be >= 0 and finite, not {stop_timeout!r}")
    return _Plan(
        tuple(consumers), tuple(producers), main, float(stop_timeout), _check_signals(signals)
    )


def _check_signals(signals: object) -> tuple[signal.Signals, ...]:
    if isinstance(signals, str | bytes) or not isinstance(signals, Iterable):
        raise InvalidType(f"signals must be a sequence of signal numbers, not {signals!r}")
    checked: list[signal.Signals] = []
    for sig in signals:
        if isinstance(sig, bool) or not isinstance(sig, int):
            raise InvalidType(f"signals must hold signal numbers (signal.SIGTERM), not {sig!r}")
        try:
            sig = signal.Signals(sig)
        except ValueError:
            raise InvalidArgument(f"{sig!r} is not a signal number") from None
        if sig in _UNCATCHABLE:
            raise InvalidArgument(f"{sig.name} cannot be caught; leave it out of signals")
        checked.append(sig)
    if checked and threading.current_thread() is not threading.main_thread():
        raise InvalidArgument(
            "signals can only be caught in the main thread; pass signals=() in other threads"
        )
    return tuple(dict.fromkeys(checked))
