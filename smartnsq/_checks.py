"""Small argument checks shared by the public API.

Every check raises :class:`~smartnsq.errors.InvalidType` for a value of the wrong type and
:class:`~smartnsq.errors.InvalidArgument` for one out of range, with a message that names the
argument and says what it accepts. They run before anything is sent.

Also here: the owner checks that stop a client from being used from another thread or after
``fork()``, and the decision whether an AUTH secret may go out without TLS.
"""

from __future__ import annotations

import json
import math
import os
import ssl
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from smartnsq.errors import (
    InvalidArgument,
    InvalidType,
    UsedAfterFork,
    WrongEventLoop,
)

# Classic nsqd's default --max-req-timeout: the longest DPUB delay it accepts.
DEFAULT_MAX_DELAY = 3600.0
# nsqd reads a delay's decimal digits into a uint64 that silently wraps, then multiplies it
# into nanoseconds (int64): a huge delay can come out as 0. Keep every delay we send below
# the point where that happens (about 292 years).
DELAY_LIMIT = 9_000_000_000.0  # seconds


def _kind(value: object) -> str:
    return type(value).__name__


def check_number(
    name: str,
    value: Any,
    *,
    min: float | None = None,
    max: float | None = None,
    above: float | None = None,
    integer: bool = False,
    allow_none: bool = False,
    hint: str = "",
) -> Any:
    """``value`` if it is a finite int/float (an int with ``integer``) within the bounds.

    ``min``/``max`` are inclusive, ``above`` exclusive. Bools are refused: ``True`` is not a
    count or a number of seconds. ``hint`` is appended to an out-of-range message.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int if integer else int | float):
        raise InvalidType(
            f"{name} must be {'an int' if integer else 'a number'}, "
            f"not {_kind(value)} ({value!r})"
            + (": pass a number, not a string" if isinstance(value, str) else "")
        )
    if not integer and not math.isfinite(value):
        raise InvalidArgument(f"{name} must be a finite number, not {value!r}")
    if min is not None and value < min:
        raise InvalidArgument(f"{name} must be >= {min}, not {value!r}{hint}")
    if above is not None and not value > above:
        raise InvalidArgument(f"{name} must be > {above}, not {value!r}{hint}")
    if max is not None and value > max:
        raise InvalidArgument(f"{name} must be <= {max}, not {value!r}{hint}")
    return value


def check_timeout(name: str, value: Any) -> float:
    """A finite number of seconds > 0."""
    result: float = check_number(name, value, above=0)
    return result


def check_bool(name: str, value: Any, *, allow_none: bool = False) -> Any:
    if value is None and allow_none:
        return None
    if type(value) is not bool:
        raise InvalidType(
            f"{name} must be True or False{' (or None)' if allow_none else ''}, "
            f"not {_kind(value)} ({value!r})"
        )
    return value


def check_str(name: str, value: Any, *, allow_none: bool = False) -> Any:
    if value is None and allow_none:
        return None
    if not isinstance(value, str):
        raise InvalidType(
            f"{name} must be a str{' (or None)' if allow_none else ''}, not {_kind(value)}"
        )
    return value


def check_callable(name: str, value: Any, *, allow_none: bool = True) -> Any:
    if value is None and allow_none:
        return None
    if not callable(value):
        raise InvalidType(f"{name} must be callable, not {_kind(value)}")
    return value


def check_tls(value: Any) -> None:
    if type(value) is not bool and not isinstance(value, ssl.SSLContext):
        raise InvalidType(
            f"tls must be True, False or an ssl.SSLContext, not {_kind(value)} ({value!r})"
        )


def check_secret(value: Any) -> None:
    if value is not None and not isinstance(value, str | bytes):
        # The value itself is not shown: it may be a secret of the wrong type.
        raise InvalidType(f"auth_secret must be a str, bytes or None, not {_kind(value)}")


def check_identify(name: str, value: Any) -> None:
    """A mapping of str keys to JSON values: it becomes part of the IDENTIFY body."""
    if not isinstance(value, Mapping):
        raise InvalidType(
            f"{name} must be a mapping (dict) of extra IDENTIFY fields, not {_kind(value)}"
        )
    for key in value:
        if not isinstance(key, str):
            raise InvalidType(f"{name} keys must be str, not {_kind(key)} ({key!r})")
    try:
        json.dumps(dict(value))
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{name} must hold JSON-serialisable values: {exc}") from None


def check_addresses(name: str, value: Any) -> list[str]:
    """A str or an iterable of str, as a list (each address is parsed later)."""
    if isinstance(value, str):
        return [value]
    if value is None or isinstance(value, bytes | bytearray) or not isinstance(value, Iterable):
        raise InvalidType(f"{name} must be a list of 'host:port' strings, not {_kind(value)}")
    addresses = list(value)
    for address in addresses:
        if not isinstance(address, str):
            raise InvalidType(
                f"{name} must hold 'host:port' strings, not {_kind(address)} ({address!r})"
            )
    return addresses


def check_no_scheme(address: str) -> None:
    if "://" in address:
        raise InvalidArgument(
            f"nsqd address {address!r} has a scheme: use 'host:port' without a scheme "
            "(nsqd speaks plain TCP; pass tls=True for TLS)"
        )


def check_lookup_options(
    seeds: Any,
    timeout: Any,
    listlookup_interval: Any,
    min_refresh_interval: Any,
    max_backoff: Any,
    cache_ttl: Any,
    cache_jitter: Any,
) -> None:
    """The arguments of :class:`~smartnsq.lookup.manager.LookupManager`."""
    check_addresses("lookupd addresses", seeds)
    check_timeout("timeout", timeout)
    check_timeout("listlookup_interval", listlookup_interval)
    check_number("min_refresh_interval", min_refresh_interval, min=0)
    check_number("max_backoff", max_backoff, min=0)
    check_timeout("cache_ttl", cache_ttl)
    check_number("cache_jitter", cache_jitter, min=0, max=1)


def check_delay(value: Any, max_delay: float) -> float:
    """A DPUB delay in seconds: nsqd refuses delays above its --max-req-timeout."""
    result: float = check_number(
        "delay",
        value,
        min=0,
        max=max_delay,
        hint=(
            " (nsqd refuses delays above its --max-req-timeout, 1 hour by default; "
            "if yours allows more, raise the Producer's max_delay)"
        ),
    )
    return result


def check_requeue_delay(value: Any) -> float | None:
    """A REQ delay in seconds, or None; nsqd caps it at its --max-req-timeout itself."""
    if value is None:
        return None
    delay: float = check_number("requeue delay", value, min=0)
    return delay if delay <= DELAY_LIMIT else DELAY_LIMIT


# -- owner: thread and process ---------------------------------------------------------------

# Bumped in a forked child: comparing it is cheaper than calling os.getpid() per call.
FORKS = [0]


def _after_fork() -> None:
    FORKS[0] += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)

get_ident: Callable[[], int] = threading.get_ident


def owner() -> tuple[int, int]:
    """(thread, fork generation) of the caller: recorded when a client starts."""
    return get_ident(), FORKS[0]


def wrong_owner(kind: str, thread: int | None, forks: int) -> None:
    """Raise the error for a client used outside its thread or process.

    Called only when the cheap comparison failed. A client never started (``thread`` None)
    passes: the caller reports that itself.
    """
    if thread is None:
        return
    if forks != FORKS[0]:
        raise UsedAfterFork(
            f"this {kind} was started in the parent process and cannot be used after fork(): "
            f"its connections belong to the parent; create a new {kind} in the child"
        )
    if thread != get_ident():
        raise WrongEventLoop(
            f"this {kind} was started in another thread's event loop: create the {kind} "
            f"inside the event loop (and thread) that uses it; with plain threads use one "
            f"{kind} per thread"
        )
