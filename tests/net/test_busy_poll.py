"""Busy polling for an answer: the sans-IO budget, and the async connection that drives it."""

from __future__ import annotations

import time
from typing import Any

import anyio
import anyio.abc
import pytest
from hypothesis import given
from hypothesis import strategies as st

import smartnsq.net.connection as connection_module
import smartnsq.net.waiters as waiters_module
from smartnsq import Connection, ConnectionConfig
from smartnsq.net.busy_poll import BusyPoll
from smartnsq.protocol.frames import OK_FRAME
from tests.helpers import UVLOOP
from tests.net.test_connection import StubLink

waits = st.lists(st.floats(min_value=0.0, max_value=0.1), max_size=40)


@given(st.floats(min_value=0.0, max_value=0.01), waits)
def test_the_budget_never_exceeds_the_limit(limit: float, seen: list[float]) -> None:
    poll = BusyPoll(limit)
    now = 0.0
    for wait in seen:
        assert 0.0 <= poll.budget(now) <= limit
        poll.observe(now, now + wait)
        now += wait
    assert 0.0 <= poll.budget(now) <= limit


def test_polls_for_twice_the_usual_wait_and_not_at_all_when_answers_are_slow() -> None:
    poll = BusyPoll(0.0005)
    assert poll.budget(0.0) == 0.0005  # nothing seen yet: the limit
    poll.observe(0.0, 0.0001)
    assert poll.budget(0.0001) == pytest.approx(0.0002)
    now = 0.0001
    for _ in range(40):
        poll.observe(now, now + 0.002)  # a remote or busy nsqd
        now += 0.002
    assert poll.budget(now) == 0.0
    for _ in range(40):
        poll.observe(now, now + 0.0001)  # answers are quick again: polling comes back
        now += 0.0001
    assert 0.0 < poll.budget(now) < 0.0005
    assert BusyPoll(0.0).budget(0.0) == 0.0


def test_a_caller_back_later_than_the_limit_does_not_poll() -> None:
    """A publisher that paces itself comes back long after its last answer: polling would
    only take the CPU from nsqd and the consumers on the machine."""
    poll = BusyPoll(0.0005)
    poll.observe(10.0, 10.0001)  # answered in 0.1 ms
    assert poll.budget(10.0001) == pytest.approx(0.0002)  # straight back: polls
    assert poll.budget(10.0005) == pytest.approx(0.0002)  # back within the limit: polls
    assert poll.budget(10.0007) == 0.0  # back 0.6 ms after its answer: it paces itself
    poll.observe(10.0007, 10.0008)
    assert poll.budget(10.0009) > 0.0  # back to back again: polling again


ASYNCIO_LOOPS = pytest.mark.parametrize("anyio_backend", ["asyncio", UVLOOP])


class Polls:
    """Records the passes of the connection's polling callback (found by its module name)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.budgets: list[float] = []  # of each chain started
        self.passes = 0
        self.passes_after_answer = 0
        self._futures: list[Any] = []  # kept alive: a freed future's id() can come back
        real = waiters_module.keep_polling

        def keep_polling(loop: Any, future: Any, until: float) -> None:
            if not any(f is future for f in self._futures):
                self._futures.append(future)
                self.budgets.append(until - time.perf_counter())
            self.passes += 1
            self.passes_after_answer += future.done()
            real(loop, future, until)

        # The connection starts the chain; each pass schedules the next by its module's name.
        monkeypatch.setattr(connection_module, "keep_polling", keep_polling)
        monkeypatch.setattr(waiters_module, "keep_polling", keep_polling)


def stub(busy_poll: float, *, long: bool = False) -> Connection:
    """A connection on a stub link; ``long``: a poll limit of 1 s (more than a config takes),
    so a slow test machine cannot end a poll before the test looks at it."""
    conn = Connection("127.0.0.1:1", StubLink(), ConnectionConfig(busy_poll=busy_poll))  # type: ignore[arg-type]
    if long:
        conn._busy = BusyPoll(1.0)
    return conn


async def ask(conn: Connection, tg: anyio.abc.TaskGroup, got: list[bytes]) -> None:
    """Start one request; return once it is queued."""

    async def one() -> None:
        got.append(await conn.request(b"PUB t\n", publish=True))

    queued = conn.pending + 1
    tg.start_soon(one)
    while conn.pending < queued:
        await anyio.sleep(0)


async def ask_alone(conn: Connection, answer_after: float = 0.0) -> bytes:
    """One request alone in flight, answered after a few loop passes (and ``answer_after``
    seconds: a slow nsqd)."""
    got: list[bytes] = []
    async with anyio.create_task_group() as tg:
        await ask(conn, tg, got)
        for _ in range(5):
            await anyio.sleep(0)  # passes in which the answer is not there yet
        if answer_after:
            await anyio.sleep(answer_after)
        conn._pump.on_data(OK_FRAME)
    return got[0]


@ASYNCIO_LOOPS
@pytest.mark.anyio
async def test_a_lone_request_keeps_the_loop_polling_until_its_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    polls = Polls(monkeypatch)
    conn = stub(0.01, long=True)
    assert await ask_alone(conn) == b"OK"
    assert polls.budgets and 0.0 < polls.budgets[0] <= 1.0  # the limit: nothing seen yet
    assert polls.passes >= 5  # the loop kept polling while the answer was due
    assert polls.passes_after_answer <= 1  # and stopped once it came
    assert await ask_alone(conn) == b"OK"
    assert len(polls.budgets) == 2


@ASYNCIO_LOOPS
@pytest.mark.anyio
async def test_a_request_sent_long_after_the_last_answer_does_not_poll(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    polls = Polls(monkeypatch)
    conn = stub(0.01)
    conn._busy = BusyPoll(0.05)  # a limit a loaded test machine's answers stay under
    assert await ask_alone(conn) == b"OK"
    assert await ask_alone(conn) == b"OK"  # straight after its answer
    assert len(polls.budgets) == 2
    await anyio.sleep(0.1)  # the caller paces itself: back later than the limit
    assert await ask_alone(conn) == b"OK"
    assert len(polls.budgets) == 2
    assert await ask_alone(conn) == b"OK"  # back to back again
    assert len(polls.budgets) == 3


@ASYNCIO_LOOPS
@pytest.mark.anyio
async def test_slow_answers_stop_the_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    polls = Polls(monkeypatch)
    conn = stub(0.001)
    assert await ask_alone(conn, answer_after=0.02) == b"OK"  # longer than the limit
    assert len(polls.budgets) == 1
    assert await ask_alone(conn) == b"OK"
    assert len(polls.budgets) == 1  # the usual wait is over the limit: no polling


@pytest.mark.parametrize("anyio_backend", ["asyncio", UVLOOP, "trio"])
@pytest.mark.anyio
async def test_never_polls_when_off_when_not_alone_or_on_trio(
    monkeypatch: pytest.MonkeyPatch, anyio_backend: Any
) -> None:
    polls = Polls(monkeypatch)
    assert await ask_alone(stub(0.0)) == b"OK"
    assert polls.passes == 0

    conn = stub(0.01)
    got: list[bytes] = []
    async with anyio.create_task_group() as tg:
        await ask(conn, tg, got)
        await ask(conn, tg, got)  # not alone: it starts no polling of its own
        conn._pump.on_data(OK_FRAME + OK_FRAME)
    assert got == [b"OK", b"OK"]
    assert len(polls.budgets) == (0 if anyio_backend == "trio" else 1)


@ASYNCIO_LOOPS
@pytest.mark.anyio
async def test_every_pass_of_a_poll_gives_the_cpu_away(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spinning even 0.1 ms without yielding took the CPU nsqd and consumers on the machine
    needed (publish-to-handler p99 at 10k msg/s 1.5 -> 3.5-4.5 ms on 2 CPUs)."""
    polls = Polls(monkeypatch)
    yields: list[float] = []
    monkeypatch.setattr(waiters_module, "cpu_yield", lambda: yields.append(1.0))
    conn = stub(0.01, long=True)
    assert await ask_alone(conn) == b"OK"  # answered within a few passes
    assert polls.passes >= 5
    assert len(yields) == polls.passes - polls.passes_after_answer
