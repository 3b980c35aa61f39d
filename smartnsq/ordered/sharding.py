"""Mapping a sharding key to a partition.

``"go"`` (default) is Youzan go-nsq's mapping: MurmurHash3 x86_32 with seed 0 over the key's
bytes, as an unsigned number, modulo ``meta.partition_num``. Go and Python producers that use
it send the same key to the same partition. ``"java"`` is the Java SDK's:
``abs(key.hashCode() % partition_num)`` with Java's ``String``/``Long`` hash codes. Any
``callable(key, partition_num) -> int`` works too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import mmh3

from smartnsq.errors import InvalidArgument, InvalidType

ShardingKey = bytes | str | int
Sharder = Callable[[ShardingKey, int], int]


def key_bytes(key: ShardingKey) -> bytes:
    """Bytes hashed for a key: bytes as they are, str as UTF-8, int as its decimal digits."""
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode()
    if isinstance(key, int) and not isinstance(key, bool):
        return str(key).encode()
    raise InvalidType(f"sharding key must be bytes, str or int, not {type(key).__name__}")


def go_partition(key: ShardingKey, partition_num: int) -> int:
    return int(mmh3.hash(key_bytes(key), 0, signed=False)) % partition_num


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def java_hash_code(key: ShardingKey) -> int:
    """``String.hashCode()`` for str (UTF-16 code units), ``Long.hashCode()`` for int."""
    if isinstance(key, bytes):
        key = key.decode()
    if isinstance(key, str):
        h = 0
        units = key.encode("utf-16-be")
        for i in range(0, len(units), 2):
            h = (31 * h + (units[i] << 8 | units[i + 1])) & 0xFFFFFFFF
        return _int32(h)
    if isinstance(key, int) and not isinstance(key, bool):
        v = key & 0xFFFFFFFFFFFFFFFF
        return _int32(v ^ (v >> 32))
    raise InvalidType(f"sharding key must be bytes, str or int, not {type(key).__name__}")


def java_partition(key: ShardingKey, partition_num: int) -> int:
    h = java_hash_code(key)
    remainder = abs(h) % partition_num  # Java's % keeps the dividend's sign; abs() undoes it
    return remainder


def sharder_for(sharding: Literal["go", "java"] | Sharder) -> Sharder:
    if sharding == "go":
        return go_partition
    if sharding == "java":
        return java_partition
    if callable(sharding):
        return sharding
    raise InvalidArgument(f"sharding must be 'go', 'java' or a callable, not {sharding!r}")
