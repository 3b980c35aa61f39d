"""Pacing's redistribute (no sockets): an even share already in place is left alone and keeps
no task looking at it (one per consumer, for 1,000 consumers), anything else is still
corrected every interval."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest
import trio
import trio.testing

import smartnsq.consumer.pacing as pacing_module
from smartnsq.consumer.rdy import distribute
from tests.consumer.test_parts import MID, MID2, Parts, read
from tests.helpers import wait_until


def test_an_even_share_in_place_is_kept_and_a_changed_one_restored() -> None:
    p = Parts(max_in_flight=10)
    (s1, c1), (s2, c2) = p.subscribe("n1:4150"), p.subscribe("n2:4150")
    p.pacing.redistribute()
    assert (s1.rdy, s2.rdy) == (5, 5)
    sent = len(c1.queued) + len(c1.written) + len(c2.queued) + len(c2.written)
    p.pacing.redistribute()
    assert len(c1.queued) + len(c1.written) + len(c2.queued) + len(c2.written) == sent
    s2.set_rdy(0)
    p.pacing.redistribute()
    assert (s1.rdy, s2.rdy) == (5, 5)
    p.state.max_in_flight = 11  # a remainder: the most recently active gets it
    p.pacing.redistribute()
    assert sorted((s1.rdy, s2.rdy)) == [5, 6]
    s1.max_rdy = 2  # capped: the other takes the rest
    p.state.max_in_flight = 10
    p.pacing.redistribute()
    assert (s1.rdy, s2.rdy) == (2, 8)


def test_a_settled_share_keeps_no_task_and_an_uneven_one_is_looked_at_every_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Trio's mock clock jumps over sleeps: a simulated hour takes no real time.
    p = Parts(max_in_flight=10, rdy_redistribute_interval=5.0)
    (s1, _), (s2, _) = p.subscribe("n1:4150"), p.subscribe("n2:4150")
    looks = [0]

    def counting(*args: Any, **kwargs: Any) -> list[int]:
        looks[0] += 1
        return distribute(*args, **kwargs)

    monkeypatch.setattr(pacing_module, "distribute", counting)
    checks: dict[str, object] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            p.state.tg = nursery  # type: ignore[assignment]  # what spawn() starts tasks in
            assert p.pacing.redistribute()  # the even share set at once: settled
            await trio.sleep(3600)
            checks["settled"] = (looks[0], s1.rdy, s2.rdy, len(nursery.child_tasks))
            p.state.max_in_flight = 11  # an uneven share: RDY moves with time again
            assert not p.pacing.redistribute()
            before = looks[0]
            await trio.sleep(62.5)  # off the 5 s grid: no tie between two wake-ups
            checks["uneven"] = (looks[0] - before, len(nursery.child_tasks))
            p.state.max_in_flight = 10
            await trio.sleep(5)  # the next look finds the even share restored, and ends
            checks["settled again"] = (sorted((s1.rdy, s2.rdy)), len(nursery.child_tasks))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert checks["settled"] == (1, 5, 5, 0)  # one look set the share; no task looks again
    assert checks["uneven"] == (12, 1)  # every 5 s while the share is uneven (5 ... 60 s)
    assert checks["settled again"] == ([5, 5], 0)


def test_an_uneven_share_set_from_a_loop_callback_still_gets_its_look() -> None:
    # Outside any task (a loop callback, under a plain asyncio.run()), where anyio cannot
    # start one: the look's task is started by one of the consumer's tasks instead (before,
    # the callback raised NoEventLoopError and no look ever ran).
    p = Parts(max_in_flight=11, rdy_redistribute_interval=0.01)
    (s1, _), (s2, _) = p.subscribe("n1:4150"), p.subscribe("n2:4150")
    settled: list[bool] = []
    failed: list[object] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: failed.append(context.get("exception")))
        async with anyio.create_task_group() as tg:
            p.state.tg = tg
            p.threads.start()
            loop.call_soon(lambda: settled.append(p.pacing.redistribute()))
            await wait_until(lambda: failed or (settled and p.pacing.looking), 5, "the look")
            assert not failed
            assert settled == [False] and sorted((s1.rdy, s2.rdy)) == [5, 6]
            p.state.max_in_flight = 10
            await wait_until(lambda: not p.pacing.looking, 5, "the look ending once even")
            assert (s1.rdy, s2.rdy) == (5, 5)
            tg.cancel_scope.cancel()

    asyncio.run(main())


def test_a_redelivery_failing_again_while_backing_off_keeps_the_probe_open() -> None:
    """nsqd hands requeued messages out ahead of the backlog, so a backoff probe often gets
    one that failed before: counting its failure again made every probe fail."""

    p = Parts(requeue_delay=0.2, backoff_unit=0.1, max_backoff_duration=1)
    backoff = p.pacing.backoff
    sub, conn = p.subscribe()
    sub.set_rdy(50)
    conn.on_messages(*read((MID, 1, b"fresh")))
    p.answers.handler_failed(p.workers.queue.popleft(), RuntimeError("bad"))
    assert (backoff.level, backoff.blocked, sub.rdy) == (1, True, 0)
    assert backoff.window_over(backoff.epoch)  # the window ran out: the probe's RDY 1
    sub.set_rdy(1)
    conn.on_messages(*read((MID, 2, b"fresh")))
    p.answers.handler_failed(p.workers.queue.popleft(), RuntimeError("bad"))
    assert (backoff.level, backoff.blocked, sub.rdy) == (1, False, 1)  # the next one decides
    conn.on_messages(*read((MID2, 1, b"another")))
    p.answers.handler_failed(p.workers.queue.popleft(), RuntimeError("bad"))
    assert (backoff.level, backoff.blocked, sub.rdy) == (2, True, 0)  # a new failure counts


def test_a_redelivery_failing_starts_a_backoff() -> None:
    """Not backing off, any failure starts one: a queue of nothing but redeliveries that
    keep failing is still slowed down."""

    p = Parts(requeue_delay=0.2)
    sub, conn = p.subscribe()
    sub.set_rdy(50)
    conn.on_messages(*read((MID, 3, b"again")))
    p.answers.handler_failed(p.workers.queue.popleft(), RuntimeError("bad"))
    assert (p.pacing.backoff.level, sub.rdy) == (1, 0)


def test_a_probe_answered_without_a_result_moves_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's message was given up (past max_attempts: no result) and the backlog waited
    on the other nsqd, at RDY 0: the probe had ended, and nothing ever ended the backoff."""
    monkeypatch.setattr(pacing_module.random, "randrange", lambda n: 0)  # n1 first
    p = Parts(max_attempts=1, backoff_unit=0.01, max_backoff_duration=0.05)
    (s1, c1), (s2, c2) = p.subscribe("n1:4150"), p.subscribe("n2:4150")
    s1.set_rdy(1)
    c1.on_messages(*read((MID, 1, b"bad")))
    p.answers.handler_failed(p.workers.queue.popleft(), RuntimeError("bad"))
    backoff = p.pacing.backoff
    assert (backoff.level, s1.rdy, s2.rdy) == (1, 0, 0)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(p.pacing._end_window, 0, backoff.epoch)
            await wait_until(lambda: s1.rdy == 1, 5, "the probe on n1")
            c1.on_messages(*read((MID, 2, b"bad")))  # given up: FIN, and no result
            await wait_until(lambda: s2.rdy == 1, 5, "the probe moved on to n2")
            c2.on_messages(*read((MID2, 1, b"good")))
            p.workers.queue.popleft().finish()
            await wait_until(lambda: backoff.level == 0, 5, "the backoff over")

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_window_ending_with_no_connection_probes_once_one_is_back() -> None:
    """Every connection was down when a backoff window ended: the probe gave up, and the
    level stayed up with nothing to end it (a consumer at RDY 0 once they were back)."""
    p = Parts(backoff_unit=0.01, max_backoff_duration=0.05)
    sub, conn = p.subscribe("n1:4150")
    sub.set_rdy(1)
    conn.on_messages(*read((MID, 1, b"bad")))
    p.answers.handler_failed(p.workers.queue.popleft(), RuntimeError("bad"))
    backoff = p.pacing.backoff
    conn.usable = False

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(p.pacing._end_window, 0, backoff.epoch)
            await trio.sleep(10)  # down for a while (a mock clock: no real time)
            conn.usable = True
            await wait_until(lambda: sub.rdy == 1, 5, "the probe once the connection is back")
            conn.on_messages(*read((MID2, 1, b"good")))
            p.workers.queue.popleft().finish()
            await wait_until(lambda: backoff.level == 0, 5, "the backoff over")

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
