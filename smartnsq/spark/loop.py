"""One event loop thread per Python process, and the Producers kept on it between tasks.

Spark runs each task's ``write()`` in a Python worker process and reuses that process for
later tasks (until it has been idle for a minute). Producers are kept here, keyed by their
configuration, so that a task finds its connections already open. A worker may be killed at
any time, so nothing is buffered: every publish is acknowledged before ``write()`` returns.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio.from_thread

from smartnsq.producer import Producer

log = logging.getLogger("smartnsq.spark")

T = TypeVar("T")

_lock = threading.Lock()
_state: _Loop | None = None


class _Loop:
    """An asyncio event loop running in a daemon thread, with the Producers it holds."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.portal = _start_portal()
        self.producers: dict[tuple[Any, ...], tuple[Producer, Any]] = {}

    def alive(self) -> bool:
        # A forked child inherits the object but not the thread.
        if self.pid != os.getpid():
            return False
        try:
            self.portal.call(lambda: None)
        except RuntimeError:
            return False
        return True


def _start_portal() -> anyio.from_thread.BlockingPortal:
    # A daemon thread of our own: anyio's start_blocking_portal() runs the loop in an
    # executor thread that the interpreter waits for at exit, so a process that never
    # closed its pool would never end.
    ready: queue.Queue[anyio.from_thread.BlockingPortal] = queue.Queue()

    async def serve() -> None:
        async with anyio.from_thread.BlockingPortal() as portal:
            ready.put(portal)
            await portal.sleep_until_stopped()

    threading.Thread(
        target=anyio.run, args=(serve,), daemon=True, name="smartnsq-spark-loop"
    ).start()
    return ready.get()


def loop() -> _Loop:
    """This process's event loop thread, started (again) if needed."""
    global _state
    with _lock:
        if _state is None or not _state.alive():
            _state = _Loop()
        return _state


def run(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Run ``await fn(*args)`` on this process's event loop and return its result."""
    return loop().portal.call(fn, *args)


def producer(key: tuple[Any, ...], kwargs: dict[str, Any]) -> Producer:
    """The pooled Producer for ``key``, entered on the loop thread; created on first use."""
    state = loop()
    with _lock:
        held = state.producers.get(key)
        if held is not None:
            return held[0]
        new = Producer(**kwargs)
        cm = state.portal.wrap_async_context_manager(new)
        cm.__enter__()
        state.producers[key] = (new, cm)
        return new


def discard(key: tuple[Any, ...]) -> None:
    """Close and forget the pooled Producer for ``key`` (after it failed a task)."""
    state = _state
    if state is None:
        return
    held = state.producers.pop(key, None)
    if held is not None:
        with contextlib.suppress(Exception):
            held[1].__exit__(None, None, None)
