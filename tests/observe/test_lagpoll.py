"""The lag poller on its own: a fetch function stands in for nsqd."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from smartnsq.errors import InvalidArgument, NsqdHttpFailed
from smartnsq.lag import ChannelLag
from smartnsq.observe.lagpoll import LagPoller
from smartnsq.observe.prometheus import check_interval


def entry(nsqd: str, messages: int | None, error: str | None = None) -> ChannelLag:
    return ChannelLag("t", "c", nsqd, None, messages, error)


class Script:
    """One scripted answer per poll."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.asked = threading.Event()

    def __call__(self) -> list[ChannelLag]:
        self.asked.set()
        answer = self.answers.pop(0) if self.answers else []
        if isinstance(answer, BaseException):
            raise answer
        assert isinstance(answer, list)
        return answer


def test_a_failed_poll_keeps_the_last_figures_and_logs_once(caplog) -> None:
    script = Script(
        [entry("a", 5), entry("b", 7)],
        NsqdHttpFailed("down"),
        NsqdHttpFailed("still down"),
        [entry("a", 1), entry("b", None, "refused")],
        [entry("a", 0)],
    )
    poller = LagPoller(script, 3600, "t/c", start=False)
    with caplog.at_level(logging.INFO, "smartnsq.observe"):
        poller.poll()
        assert poller.last() == {("a", None): 5, ("b", None): 7}
        poller.poll()
        poller.poll()
        assert poller.last() == {("a", None): 5, ("b", None): 7}
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "down" in warnings[0].getMessage()
        poller.poll()  # b failed alone: it keeps its figure, a moves on
        assert poller.last() == {("a", None): 1, ("b", None): 7}
        assert any("answers again" in r.getMessage() for r in caplog.records)
        poller.poll()  # b no longer listed: gone
        assert poller.last() == {("a", None): 0}
    assert poller.polls == 5


def test_a_bug_in_the_fetch_is_logged_and_the_next_poll_still_runs(caplog) -> None:
    poller = LagPoller(Script(RuntimeError("bug"), [entry("a", 3)]), 3600, "t/c", start=False)
    with caplog.at_level(logging.WARNING, "smartnsq.observe"):
        poller.poll()
    assert "bug" in caplog.text
    poller.poll()
    assert poller.last() == {("a", None): 3}


def test_the_thread_polls_until_stopped() -> None:
    script = Script([entry("a", 2)])
    poller = LagPoller(script, 3600, "t/c")
    assert script.asked.wait(5)
    assert poller.running
    poller.stop(wait=5)
    assert not poller.running
    assert poller.last() == {("a", None): 2}


def test_a_set_up_error_is_logged_and_ends_the_polls(caplog) -> None:
    script = Script(InvalidArgument("no lookupd: pass nsqd_http_addresses"))
    with caplog.at_level(logging.WARNING, "smartnsq.observe"):
        poller = LagPoller(script, 0.01, "t/c")
        deadline = time.monotonic() + 5
        while poller.running and time.monotonic() < deadline:  # it ends on its own
            time.sleep(0.01)
    assert not poller.running
    assert "not polled: no lookupd" in caplog.text
    assert script.answers == [] and poller.polls == 1


@pytest.mark.parametrize("bad", [0, -1, True, "5"])
def test_the_interval_is_checked(bad) -> None:
    with pytest.raises(InvalidArgument, match="lag_interval"):
        check_interval(bad)
