"""Problems a program must not miss even when it configured no logging.

smartnsq configures no logging: the ``smartnsq`` logger has a ``NullHandler``, which also
keeps Python's last-resort handler from printing. So a handler that keeps failing, or a topic
that does not exist yet, would go unseen in a program that never set up logging. Each such
problem is logged as usual and, when no handler would show that record, also given once per
process (per kind of problem) as an :class:`UnloggedWarning` through :mod:`warnings`, which
prints it to stderr by default and which a program can filter like any warning.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings

__all__ = [
    "UnloggedWarning",
    "handler_failed",
    "heard",
    "settings_refused",
    "topic_missing",
    "warn_unheard",
]

_lock = threading.Lock()
_said: set[object] = set()

_HOW = (
    "shown once because no logging handler is configured for the 'smartnsq' logger: "
    "configure logging (e.g. logging.basicConfig()) to see every occurrence"
)


class UnloggedWarning(UserWarning):
    """smartnsq logged a problem that no logging handler shows (given once per process and
    kind of problem). Configure logging to see every occurrence, or filter this warning."""


def heard(logger: logging.Logger, level: int = logging.WARNING) -> bool:
    """Whether a record of ``level`` from ``logger`` reaches a handler that shows it.

    A ``NullHandler`` shows nothing. A logger disabled for ``level`` (by its level or by
    ``logging.disable``) counts as heard: someone chose silence."""
    if not logger.isEnabledFor(level):
        return True
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            if not isinstance(handler, logging.NullHandler) and level >= handler.level:
                return True
        if not current.propagate:
            break
        current = current.parent
    return False


def warn_unheard(logger: logging.Logger, key: object, text: str) -> bool:
    """Give ``text`` as an :class:`UnloggedWarning` if ``logger`` shows no WARNING and
    nothing was given for ``key`` yet in this process. True when it was given."""
    if heard(logger):
        return False
    with _lock:
        if key in _said:
            return False
        _said.add(key)
    _give(text)
    return True


def _give(text: str) -> None:
    # `-W error` must not turn a notice into a failure of the code that gives it
    with contextlib.suppress(Exception):
        warnings.warn(f"{text} ({_HOW})", UnloggedWarning, stacklevel=4)


def handler_failed(logger: logging.Logger, what: str, exc: BaseException) -> None:
    """A message handler raised (already logged by the caller): say so once if unheard."""
    name = type(exc).__name__
    warn_unheard(
        logger,
        "handler-failed",
        f"a message handler raised {name}: {exc} ({what}); unanswered messages are requeued",
    )


def topic_missing(logger: logging.Logger, topic: str, channel: str, interval: float) -> None:
    """No lookupd lists an nsqd for ``topic``: logged at WARNING once per process for
    (``topic``, ``channel``), and given as a warning if unheard. The caller keeps waiting."""
    key = ("topic-missing", topic, channel)
    with _lock:
        if key in _said:
            return
        _said.add(key)
    text = (
        f"no lookupd lists an nsqd for topic {topic!r} (TOPIC_NOT_FOUND: it does not exist "
        f"yet, or no nsqd has it); channel {channel!r} keeps waiting and asks lookupd again "
        f"every {interval:g} s"
    )
    logger.warning("%s", text)
    if not heard(logger):
        _give(text)


def settings_refused(
    logger: logging.Logger, address: str, exc: BaseException, *, error: bool = False
) -> None:
    """nsqd refused settings it accepted before: given once per process and nsqd if unheard;
    with ``error``, also logged as an ERROR, once (else the caller logs it)."""
    key = ("settings-refused", address)
    text = (
        f"{exc}; nsqd took these settings before (restarted with other limits?); trying "
        "again cannot help until the setting or nsqd changes"
    )
    if error:
        with _lock:
            if key in _said:
                return
            _said.add(key)
        logger.error("%s", text)
        if not heard(logger, logging.ERROR):
            _give(text)
        return
    warn_unheard(logger, key, text)
