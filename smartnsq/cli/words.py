"""The command line speaks in its own flags: library argument names in error messages become
the flags that set them, and ``--producer-opt`` / ``--consumer-opt`` pass other keyword
arguments through (as to_nsq's and nsq_tail's ``--producer-opt`` / ``--consumer-opt`` do)."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import click

__all__ = ["flag_words", "parse_duration", "pass_through"]

# Longest first: "lookupd_http_addresses" before "lookupd".
_WORDS = [
    (r"\(tls=True\)", "(--tls)"),
    (r"\bpass tls=True\b", "give --tls"),
    (r"\buse tls=True\b", "use --tls"),
    (r"\btls=True\b", "--tls"),
    (r"\blookupd_http_addresses\b", "--lookupd"),
    (r"\bnsqd_tcp_addresses\b", "--nsqd"),
    (r"\bauth_secret\b", "--auth-secret"),
    (r"\bauth_over_plaintext=False\b", "--producer-opt auth_over_plaintext=false"),
    (r"\bsharding_key\b", "--key"),
    (r"\bwithout partition=", "without --partition"),
    (r"\bpublish without delay\b", "publish without --delay"),
]


def flag_words(text: str) -> str:
    """``text`` with the library's argument names replaced by the flags that set them."""
    text = text.replace("pass partition= yourself", "give --partition yourself")
    for pattern, flag in _WORDS:
        text = re.sub(pattern, flag, text)
    return text


_EMPTY = inspect.Parameter.empty
_TIME_UNITS = {
    "": 1.0,
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_DURATION_PART = r"(\d+(?:\.\d+)?)\s*(ns|us|\u00b5s|ms|s|m|h)"


def parse_duration(text: str) -> float:
    """``30`` (seconds), ``250ms``, ``10s``, ``5m``, ``1h``, or as Go writes durations
    (``1m30s``, ``1h0m0s``): a duration in seconds."""
    text = text.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        seconds = float(text)
    elif re.fullmatch(f"(?:{_DURATION_PART})+", text):
        seconds = sum(float(n) * _TIME_UNITS[unit] for n, unit in re.findall(_DURATION_PART, text))
    else:
        seconds = 0.0
    if seconds <= 0:
        raise click.BadParameter(f"{text!r} is not a duration like 250ms, 30s, 5m or 1h")
    return seconds


# go-nsq's names for the same settings (to_nsq / nsq_tail habits).
_ALIASES = {
    "dial_timeout": "connect_timeout",
    "default_requeue_delay": "requeue_delay",
    "tls_v1": "tls",
    "auth_secret": "auth_secret",
}

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _convert(flag: str, name: str, default: Any, value: str) -> Any:
    """``value`` as the type of the keyword's default (JSON for anything else)."""
    try:
        if isinstance(default, bool):
            if value.lower() not in _TRUE | _FALSE:
                raise ValueError("expected true or false")
            return value.lower() in _TRUE
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float):
            try:
                return float(value)
            except ValueError:
                return parse_duration(value)  # Go style: 30s, 250ms
        if isinstance(default, str):
            return value
        try:
            return json.loads(value)
        except ValueError:
            return value  # a plain string where None is the default
    except (ValueError, click.BadParameter) as exc:
        message = exc.message if isinstance(exc, click.BadParameter) else str(exc)
        raise click.BadParameter(f"{name}={value}: {message}", param_hint=flag) from None


_SAMPLES: dict[str, Any] = {"bool": False, "float": 0.0, "int": 0, "str": ""}


def _sample(p: inspect.Parameter) -> Any:
    """A value of the type the keyword takes: its default, or for a None default one made
    from its annotation (``msg_timeout: float | None = None`` takes ``3s`` as 3.0)."""
    if p.default is not None:
        return p.default
    text = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")
    names = {part.strip() for part in str(text).split("|")} - {"None"}
    if names == {"float", "int"}:
        return 0.0
    return _SAMPLES.get(names.pop()) if len(names) == 1 else None


def pass_through(
    flag: str, pairs: Sequence[str], target: Callable[..., Any], reserved: Mapping[str, str]
) -> dict[str, Any]:
    """Keyword arguments for ``target`` from ``NAME=VALUE`` pairs (``-`` may stand for ``_``).

    ``reserved`` maps the keywords the command's own flags set to those flags: refused here.
    """
    params = {
        name: _sample(p)
        for name, p in inspect.signature(target).parameters.items()
        if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD
    }
    taken = set(reserved)
    out: dict[str, Any] = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        name = name.strip().replace("-", "_")
        name = _ALIASES.get(name, name)
        if not eq or not name:
            raise click.BadParameter(f"{pair!r} is not NAME=VALUE", param_hint=flag)
        if name in taken:
            raise click.BadParameter(
                f"{name} is set with {reserved[name]}",
                param_hint=flag,
            )
        if name not in params or params[name] is _EMPTY:
            known = ", ".join(
                sorted(n for n, d in params.items() if n not in taken and d is not _EMPTY)
            )
            raise click.BadParameter(f"unknown option {name!r}; known: {known}", param_hint=flag)
        out[name] = _convert(flag, name, params[name], value)
    return out


def never_give_up(extra: dict[str, Any], undone: str) -> dict[str, Any]:
    """Consumer keywords of a command that must not finish a message it has not delivered
    (``undone``: "copied", "sent"): no attempt limit, unless the messages given up go to a
    dead-letter topic; held messages are touched so that none times out while it waits."""
    extra.setdefault("max_attempts", 0)
    if extra["max_attempts"] and not extra.get("dead_letter_topic"):
        raise click.UsageError(
            f"--consumer-opt max_attempts would finish messages that were not {undone}: add "
            "--consumer-opt dead_letter_topic=TOPIC for them to go to"
        )
    extra.setdefault("auto_touch", True)
    return extra
