"""Answers' counters of what nsqd refused (the refusals themselves come from real nsqd in
tests/integration/test_consumer_classic.py::test_stats_count_what_nsqd_accepted)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from smartnsq.consumer.answers import Answers
from smartnsq.errors import FinFailed, ReqFailed, TouchFailed
from smartnsq.protocol.message import RawMessage


def answers() -> Answers:
    a = Answers(SimpleNamespace(), SimpleNamespace())  # type: ignore[arg-type]
    a.finished, a.requeued = 5, 5
    return a


def test_a_refused_fin_or_req_is_taken_back() -> None:
    a = answers()
    a.refused_by_nsqd(FinFailed("E_FIN_FAILED", "FIN 0a1b2c3d4e5f6a7b failed ID not in flight"))
    a.refused_by_nsqd(ReqFailed("E_REQ_FAILED", "REQ 0a1b2c3d4e5f6a7b failed ID not in flight"))
    a.refused_by_nsqd(TouchFailed("E_TOUCH_FAILED", "TOUCH 0a1b2c3d4e5f6a7b failed"))
    assert (a.finished, a.requeued, a.refused) == (4, 4, 2)


def test_a_given_up_message_s_refused_fin_takes_nothing_back() -> None:
    a = answers()
    msg: Any = RawMessage(0, 6, b"0a1b2c3d4e5f6a7b", b"x")
    a.not_counted(msg)  # its FIN was not counted as finished
    a.refused_by_nsqd(FinFailed("E_FIN_FAILED", "FIN 0a1b2c3d4e5f6a7b failed ID not in flight"))
    assert (a.finished, a.refused) == (5, 1)
    youzan: Any = RawMessage(0, 6, (77).to_bytes(8, "big") + bytes(8), b"x")
    a.not_counted(youzan)
    a.refused_by_nsqd(FinFailed("E_FIN_FAILED", "FIN 77 failed not in flight"))
    assert (a.finished, a.refused) == (5, 2)
    # as the fork (v0.3.7-HA) really writes it: the id's bytes as Go prints them
    a.not_counted(youzan)
    text = "FIN [0 0 0 0 0 0 0 77 0 0 0 0 0 0 0 0] failed ErrType:7 ErrCode:0 : not in flight"
    a.refused_by_nsqd(FinFailed("E_FIN_FAILED", text))
    assert (a.finished, a.refused) == (5, 3)
