"""The consumer's backoff policy (sans-IO): levels, windows, stale timers."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from smartnsq.consumer.backoff import RESUME, Backoff, Window


def policy(unit: float = 1.0, max_duration: float = 128.0) -> Backoff:
    return Backoff(unit, max_duration, uniform=lambda lo, hi: hi)  # no jitter


def test_failures_open_growing_windows_and_successes_resume() -> None:
    b = policy(unit=0.5)
    first = b.result(success=False)
    assert first == Window(interval=1.0, epoch=1, entering=True) and b.level == 1
    assert b.result(success=False) is None  # inside the window: not counted
    assert b.result(success=True) is None
    assert b.window_over(first.epoch) and not b.blocked
    second = b.result(success=False)  # the probe message failed too
    assert second == Window(interval=2.0, epoch=2, entering=False) and b.level == 2
    assert b.window_over(2)
    again = b.result(success=True)  # one level down: still backing off
    assert isinstance(again, Window) and again.interval == 1.0 and b.level == 1
    assert b.window_over(again.epoch)
    assert b.result(success=True) == RESUME and b.level == 0 and not b.blocked
    assert b.result(success=True) is None  # nothing to do at level 0


def test_stale_and_cancelled_windows_do_nothing() -> None:
    b = policy()
    window = b.result(success=False)
    assert isinstance(window, Window)
    assert not b.window_over(window.epoch - 1) and b.blocked
    b.cancel()  # the consumer stops: the pending timer must not let a message through
    assert not b.window_over(window.epoch) and b.blocked


def test_level_and_window_are_capped() -> None:
    b = policy(unit=1.0, max_duration=10.0)
    assert b.max_level == 4  # ceil(log2(10))
    for _ in range(10):
        window = b.result(success=False)
        assert isinstance(window, Window)
        b.window_over(window.epoch)
    assert b.level == 4 and window.interval == 10.0
    jittered = Backoff(1.0, 10.0, uniform=lambda lo, hi: lo)
    assert jittered.result(success=False) == Window(interval=1.6, epoch=1, entering=True)


@given(st.lists(st.sampled_from(["ok", "fail", "timer"]), max_size=60))
def test_level_stays_in_range_and_windows_match_the_level(events: list[str]) -> None:
    b = policy(unit=0.25, max_duration=4.0)
    for event in events:
        if event == "timer":
            b.window_over(b.epoch)
            continue
        level, blocked = b.level, b.blocked
        step = b.result(success=event == "ok")
        assert 0 <= b.level <= b.max_level
        if blocked or (event == "ok" and level == 0):
            assert step is None and b.level == level
        elif b.level == 0:
            assert step == RESUME and not b.blocked
        else:
            assert isinstance(step, Window) and b.blocked and step.epoch == b.epoch
            assert step.interval == min(0.25 * 2**b.level, 4.0)
