"""Mapping a sharding key to a partition.

``"go"`` (default) is Youzan go-nsq's mapping: MurmurHash3 x86_32 with seed 0 over the key's
bytes, as an unsigned number, modulo ``meta.partition_num``. Go and Python producers that use
it send the same key to the same partition. ``"java"`` is the Java SDK's:
``abs(key.hashCode() % partition_num)`` with Java's ``String``/``Long`` hash codes: a
``str`` key (or UTF-8 ``bytes``) matches the Java SDK's ``setTopicShardingIDString``, an
``int`` key (a signed 64-bit long) its ``setTopicShardingIDLong``. Any
``callable(key, partition_num) -> int`` works too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

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


def _load_murmur3(key: bytes, seed: int = 0, signed: bool = True) -> int:
    """Import mmh3 on the first keyed publish and put its hash in ``_murmur3`` for the next."""
    global _murmur3
    import mmh3

    _murmur3 = mmh3.hash
    return _murmur3(key, seed, signed)


# mmh3.hash once the first key was hashed: `import smartnsq` does not import mmh3, and a keyed
# publish pays one global lookup, as before, not an import.
_murmur3: Callable[[bytes, int, bool], int] = _load_murmur3


def go_partition(key: ShardingKey, partition_num: int) -> int:
    return int(_murmur3(key_bytes(key), 0, False)) % partition_num


# Java's long: an int key outside it has no Java twin (2**64 would hash as 0 does).
JAVA_LONG_MIN = -(2**63)
JAVA_LONG_MAX = 2**63 - 1


def check_java_key(key: ShardingKey) -> str | int:
    """A key as the Java SDK sees it: a ``str`` (``setTopicShardingIDString``; ``bytes``
    must be UTF-8) or an ``int`` in Java's signed 64-bit ``long`` range
    (``setTopicShardingIDLong``).

    Raises:
        InvalidArgument: ``bytes`` that are not UTF-8, or an int outside the long range.
        InvalidType: Not bytes, str or int.
    """
    if isinstance(key, bytes):
        try:
            return key.decode()
        except UnicodeDecodeError as exc:
            raise InvalidArgument(
                f"sharding key {key[:40]!r} is not UTF-8: the 'java' sharding hashes a Java "
                "String (setTopicShardingIDString); pass a str, or use sharding='go'"
            ) from exc
    if isinstance(key, str):
        return key
    if isinstance(key, int) and not isinstance(key, bool):
        if not JAVA_LONG_MIN <= key <= JAVA_LONG_MAX:
            raise InvalidArgument(
                f"sharding key {key} is outside Java's long range [-2**63, 2**63 - 1]: the "
                "'java' sharding hashes a Java long (setTopicShardingIDLong)"
            )
        return key
    raise InvalidType(f"sharding key must be bytes, str or int, not {type(key).__name__}")


def check_key(key: ShardingKey, sharder: Sharder) -> None:
    """Check a key before anything is sent: its type, and what ``sharder`` can hash."""
    if sharder is java_partition:
        check_java_key(key)
    else:
        key_bytes(key)


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def java_hash_code(key: ShardingKey) -> int:
    """``String.hashCode()`` for str (UTF-16 code units), ``Long.hashCode()`` for int.

    Raises:
        InvalidArgument: ``bytes`` that are not UTF-8, or an int outside Java's long range.
        InvalidType: Not bytes, str or int.
    """
    key = check_java_key(key)
    if isinstance(key, str):
        h = 0
        units = key.encode("utf-16-be")
        for i in range(0, len(units), 2):
            h = (31 * h + (units[i] << 8 | units[i + 1])) & 0xFFFFFFFF
        return _int32(h)
    v = key & 0xFFFFFFFFFFFFFFFF
    return _int32(v ^ (v >> 32))


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
