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


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger and the trace fields."""

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
        return json.dumps(out, separators=(",", ":"), default=str)
