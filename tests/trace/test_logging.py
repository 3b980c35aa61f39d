"""Logging: quiet unless the application asks, and structured when it does."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

from smartnsq.trace import JsonFormatter


def test_nothing_reaches_stderr_unless_logging_is_configured():
    code = (
        "import logging, smartnsq\n"
        "logging.getLogger('smartnsq.consumer').warning('connection lost')\n"
        "logging.getLogger('smartnsq.consumer').error('still lost')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stderr == ""
    configured = "import logging; logging.basicConfig()\n" + code
    run = subprocess.run(
        [sys.executable, "-c", configured], capture_output=True, text=True, check=True
    )
    assert "connection lost" in run.stderr  # the application's own handler still gets it


def record(**kwargs: object) -> logging.LogRecord:
    logger = logging.getLogger("smartnsq.test")
    try:
        raise ValueError("boom")
    except ValueError:
        exc_info = sys.exc_info()
    return logger.makeRecord(
        "smartnsq.test",
        logging.ERROR,
        __file__,
        1,
        "handler failed for %s",
        ("m1",),
        exc_info,
        extra=kwargs,
        sinfo="Stack (most recent call last):\n  here",
    )


def test_json_formatter_keeps_traceback_stack_and_extra_fields():
    line = json.loads(JsonFormatter().format(record(message_id="0a1b", attempts=3)))
    assert line["message"] == "handler failed for m1"
    assert line["message_id"] == "0a1b" and line["attempts"] == 3
    assert "ValueError: boom" in line["exc_info"]
    assert "here" in line["stack_info"]
    assert line["level"] == "ERROR" and line["logger"] == "smartnsq.test"
