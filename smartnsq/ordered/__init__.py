"""Sharding keys to partitions, and checking the order of consumed partitions."""

from smartnsq.ordered.sharding import (
    Sharder,
    ShardingKey,
    go_partition,
    java_hash_code,
    java_partition,
    sharder_for,
)

__all__ = [
    "Sharder",
    "ShardingKey",
    "go_partition",
    "java_hash_code",
    "java_partition",
    "sharder_for",
]
