"""The exit status every command shares, and the verdict of its JSON summary."""

from __future__ import annotations

import signal

from smartnsq.cli.status import Verdict


def test_done_interrupted_and_failed_and_a_failure_outranks_a_signal():
    verdict = Verdict("x")
    assert verdict.status == 0 and verdict.fields() == {
        "ok": True, "status": "ok", "exit_status": 0, "error": None,
    }  # fmt: skip
    verdict.interrupt(signal.SIGTERM)
    verdict.interrupt(signal.SIGINT)  # the first signal counts
    assert verdict.status == 143 and verdict.fields()["status"] == "interrupted"
    verdict.fail("disk\n full")
    verdict.fail("later")  # the first reason counts
    assert verdict.status == 1
    assert verdict.fields() == {
        "ok": False, "status": "failed", "exit_status": 1, "error": "disk full",
    }  # fmt: skip


def test_finish_says_the_reason_in_one_line(capsys):
    verdict = Verdict("to-file")
    verdict.fail("cannot write")
    assert verdict.finish() == 1
    assert capsys.readouterr().err == "smartnsq to-file: error: cannot write\n"
    assert Verdict("tail").finish() == 0
    assert capsys.readouterr().err == ""
