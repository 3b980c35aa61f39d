"""Message tracing: run-time switches and structured trace records.

Records go to the logger ``smartnsq.trace`` at INFO, each carrying a ``trace`` dict in the
log record; [`JsonFormatter`][smartnsq.trace.JsonFormatter] renders them one JSON object per
line. Nothing is logged for a topic whose tracing is off.
"""

from smartnsq.trace.records import TRACE_LOGGER, JsonFormatter, emit
from smartnsq.trace.switch import TraceSwitch

__all__ = ["TRACE_LOGGER", "JsonFormatter", "TraceSwitch", "emit"]
