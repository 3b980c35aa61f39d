"""Structured trace records on the ``smartnsq.trace`` logger."""

from __future__ import annotations

import json
import logging
from typing import Any

TRACE_LOGGER = logging.getLogger("smartnsq.trace")
"""The ``smartnsq.trace`` logger that trace records go to (at INFO)."""


def emit(event: str, **fields: Any) -> None:
    """Log one trace record on the ``smartnsq.trace`` logger at INFO.

    Nothing is built when that logger does not log INFO. The record carries the fields as a
    ``trace`` dict (``JsonFormatter`` writes them as JSON).

    Args:
        event: What happened: ``"publish"`` or ``"consume"``.
        **fields: The record's fields (topic, partition, nsqd, internal_id, trace_id,
            offset, ...).
    """
    if TRACE_LOGGER.isEnabledFor(logging.INFO):
        record = {"event": event, **fields}
        TRACE_LOGGER.info("%s %s", event, record, extra={"trace": record})


# What every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, the message or trace fields, the
    fields given with ``extra=``, and the traceback (``exc_info``) and stack, when present."""

    def format(self, record: logging.LogRecord) -> str:
        """Render one log record as a JSON object on one line.

        Args:
            record: The log record.

        Returns:
            The JSON text: ``ts`` (seconds since the epoch), ``level``, ``logger``, then the
                trace fields or ``message``, the ``extra=`` fields, and ``exc_info`` /
                ``stack_info`` when present.
        """
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
        }
        trace = getattr(record, "trace", None)
        if isinstance(trace, dict):
            out.update(trace)
        else:
            out["message"] = record.getMessage()
        for key, value in vars(record).items():
            if key not in _STANDARD and key != "trace" and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc_info"] = record.exc_text
        if record.stack_info:
            out["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(out, separators=(",", ":"), default=str)
