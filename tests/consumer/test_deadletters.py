"""Dead letters: the parts that need no server (the consumer's use of them is tested against
real nsqd in tests/integration/test_dead_letters.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from smartnsq.consumer.deadletters import ERROR_LIMIT, UNKNOWN, LastErrors, error_text


def test_error_text_names_the_type_and_is_bounded_in_utf8_bytes() -> None:
    assert error_text(ValueError("bad row 7")) == "ValueError: bad row 7"
    assert error_text(None) == UNKNOWN
    long = error_text(RuntimeError("é" * 5000))
    assert long.startswith("RuntimeError: é") and long.endswith("...")
    assert len(long.encode()) <= ERROR_LIMIT
    long.encode().decode()  # never cut inside a character


def msg(mid: bytes) -> Any:
    return SimpleNamespace(id=mid)


def test_last_errors_remembers_the_latest_and_forgets_the_oldest() -> None:
    errors = LastErrors(size=2)
    first, second = ValueError("1"), ValueError("2")
    errors.failed(msg(b"a"), first)
    errors.failed(msg(b"a"), second)
    errors.failed(msg(b"b"), first)
    errors.failed(msg(b"c"), first)  # a is the oldest: forgotten
    assert len(errors) == 2
    assert errors.pop(msg(b"a")) is None
    assert errors.pop(msg(b"b")) is first
    assert errors.pop(msg(b"b")) is None  # popped once
