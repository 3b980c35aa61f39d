"""smartnsq.run / serve argument checks and runs without clients (no server needed)."""

from __future__ import annotations

import math
import signal
import threading
import warnings
from typing import Any

import anyio
import pytest

import smartnsq
from smartnsq import Consumer, Producer
from smartnsq.errors import InvalidArgument, InvalidType

ADDRESS = "127.0.0.1:4150"  # never contacted: the checks fail before anything starts


def consumer() -> Consumer:
    return Consumer("t", "c", lambda m: None, nsqd_tcp_addresses=[ADDRESS])


@pytest.mark.parametrize(
    ("kwargs", "error", "says"),
    [
        ({"stop_timeout": -1}, InvalidArgument, "stop_timeout must be >= 0"),
        ({"stop_timeout": math.nan}, InvalidArgument, "stop_timeout"),
        ({"stop_timeout": math.inf}, InvalidArgument, "finite"),
        ({"stop_timeout": "10"}, InvalidType, "number of seconds"),
        ({"stop_timeout": True}, InvalidType, "number of seconds"),
        ({"main": 5}, InvalidType, "async function"),
        ({"signals": [signal.SIGKILL]}, InvalidArgument, "SIGKILL cannot be caught"),
        ({"signals": [123456]}, InvalidArgument, "not a signal number"),
        ({"signals": ["SIGTERM"]}, InvalidType, "signal.SIGTERM"),
        ({"signals": "SIGTERM"}, InvalidType, "sequence of signal numbers"),
        ({"backend": "tornado"}, InvalidArgument, "backend must be one of"),
        ({"backend_options": 1}, InvalidType, "backend_options"),
    ],
)
def test_run_and_serve_reject_bad_arguments(kwargs: dict[str, Any], error: type, says: str) -> None:
    c = consumer()
    with pytest.raises(error, match=says):
        smartnsq.run(c, **kwargs)
    if not any(k.startswith("backend") for k in kwargs):  # run() only
        with pytest.raises(error, match=says):
            anyio.run(lambda: smartnsq.serve(c, **kwargs))


def test_run_rejects_what_is_not_a_client() -> None:
    with pytest.raises(InvalidType, match="Consumer and Producer instances, not 'events'"):
        smartnsq.run(consumer(), "events")  # type: ignore[arg-type]


def test_run_rejects_a_client_passed_twice() -> None:
    p = Producer([ADDRESS])
    with pytest.raises(InvalidArgument, match="only once"):
        smartnsq.run(p, p)


def test_main_called_by_mistake_is_rejected_without_a_warning() -> None:
    async def main() -> None:
        pass

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" would fail here
        with pytest.raises(InvalidType, match=r"pass main, not main\(\)"):
            smartnsq.run(main=main())  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_main_returning_ends_the_run(backend: str) -> None:
    ran: list[str] = []

    async def main() -> None:
        ran.append(backend)

    assert smartnsq.run(main=main, backend=backend) is None
    assert ran == [backend]


def test_a_sync_main_is_reported() -> None:
    with pytest.raises(InvalidType, match="main must be an async function; it returned 3"):
        smartnsq.run(main=lambda: 3)  # type: ignore[arg-type,return-value]


def test_signals_outside_the_main_thread_are_refused() -> None:
    caught: list[BaseException] = []

    async def main() -> None:
        pass

    def in_thread() -> None:
        try:
            smartnsq.run(main=main)
        except BaseException as exc:
            caught.append(exc)
        try:
            smartnsq.run(main=main, signals=())  # fine without signals
        except BaseException as exc:
            caught.append(exc)

    t = threading.Thread(target=in_thread)
    t.start()
    t.join(10)
    assert len(caught) == 1 and isinstance(caught[0], InvalidArgument), caught
    assert "signals=()" in str(caught[0])
