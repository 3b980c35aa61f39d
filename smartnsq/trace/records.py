"""Structured trace records on the ``smartnsq.trace`` logger."""

from __future__ import annotations

import json
import logging
from typing import Any

TRACE_LOGGER = logging.getLogger("smartnsq.trace")


def emit(event: str, **fields: Any) -> None:
    """Log one trace record (``event`` is ``"publish"`` or ``"consume"``)."""
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
