"""``--output-buffer-timeout`` and ``--output-buffer-size`` of the reading commands: how long
and how much nsqd may hold before writing to the consumer (go-nsq's ``output_buffer_timeout``
and ``output_buffer_size``, which nsq_tail and nsq_to_file take through ``--consumer-opt``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

import click

from smartnsq.errors import InvalidArgument
from smartnsq.protocol.handshake import check_output_buffer

__all__ = ["RESERVED", "buffer_options", "consumer_buffer_options"]

F = TypeVar("F", bound=Callable[..., Any])

# The Consumer keywords these flags set: refused by --consumer-opt, which names the flag.
RESERVED = {
    "output_buffer_timeout": "--output-buffer-timeout",
    "output_buffer_size": "--output-buffer-size",
}

_ZERO = re.compile(r"0+(\.0*)?\s*(ms|s|m|h)?")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|)")
_TIME_UNITS = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_SIZE = re.compile(r"(\d+)\s*([kmg]?)i?b?")
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def buffer_options(fn: F) -> F:
    """The two flags (values reach the command as ``output_buffer_timeout`` and
    ``output_buffer_size`` text, or None)."""
    fn = click.option(
        "--output-buffer-size",
        metavar="SIZE",
        help="Bytes nsqd may buffer before writing to this reader (e.g. 4096, 16K; 0: no "
        "buffering). Default: nsqd's (16K); nsqd refuses more than its "
        "--max-output-buffer-size (64K).",
    )(fn)
    return click.option(
        "--output-buffer-timeout",
        metavar="DURATION",
        help="Longest nsqd holds messages before writing them to this reader (e.g. 25ms; 0: "
        "write each at once). Default: nsqd's (250ms). Lower gets messages at a low rate "
        "sooner, at the cost of more writes; nsqd refuses less than its "
        "--min-output-buffer-timeout (25ms).",
    )(fn)


def consumer_buffer_options(timeout: str | None, size: str | None) -> dict[str, Any]:
    """The Consumer keywords for the flags given, checked as the Consumer would check them
    but reported with the flags' names."""
    out: dict[str, Any] = {}
    if timeout is not None:
        out["output_buffer_timeout"] = _duration(timeout)
    if size is not None:
        out["output_buffer_size"] = _size(size)
    try:
        check_output_buffer(out.get("output_buffer_size"), out.get("output_buffer_timeout"))
    except InvalidArgument as exc:
        message = str(exc)
        for name, flag in RESERVED.items():
            message = message.replace(name, flag)
        message = message.replace("0.001 seconds", "1ms")
        given = timeout if "timeout" in message else size
        raise click.UsageError(f"{message.rsplit(', not ', 1)[0]}, not {given!r}") from None
    return out


def _duration(text: str) -> float:
    """``25ms``, ``0.5s``, ``1`` (seconds), ``0``: seconds."""
    clean = text.strip().lower()
    if _ZERO.fullmatch(clean):
        return 0.0
    m = _DURATION.fullmatch(clean)
    if not m:
        raise click.UsageError(
            f"--output-buffer-timeout {text!r} is not a duration like 25ms, 1s or 0"
        )
    return float(m.group(1)) * _TIME_UNITS[m.group(2)]


def _size(text: str) -> int:
    """``4096``, ``16K``, ``0``: bytes."""
    m = _SIZE.fullmatch(text.strip().lower())
    if not m:
        raise click.UsageError(f"--output-buffer-size {text!r} is not a size like 4096, 16K or 0")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2)]
