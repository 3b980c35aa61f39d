"""Sharding keys to partitions, and checking the order of consumed partitions."""

from smartnsq.ordered.sharding import (
    Sharder,
    ShardingKey,
    go_partition,
    java_hash_code,
    java_partition,
    sharder_for,
)
from smartnsq.ordered.validation import OrderChecker

__all__ = [
    "OrderChecker",
    "Sharder",
    "ShardingKey",
    "go_partition",
    "java_hash_code",
    "java_partition",
    "sharder_for",
]
