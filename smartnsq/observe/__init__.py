"""Observing producers and consumers: their stats, and optional metrics and tracing hooks.

:mod:`smartnsq.observe.prometheus` (``smartnsq[prometheus]``) exposes the stats to a
Prometheus registry; :mod:`smartnsq.observe.otel` (``smartnsq[otel]``) adds OpenTelemetry
spans to publishes and handlers. Neither is imported by ``import smartnsq``.
"""

from smartnsq.stats import (
    ConsumerNodeStats,
    ConsumerStats,
    ProducerNodeStats,
    ProducerStats,
)

__all__ = ["ConsumerNodeStats", "ConsumerStats", "ProducerNodeStats", "ProducerStats"]
