"""Sharding-key mappings against independently known reference values."""

import pytest

from smartnsq.errors import InvalidArgument, InvalidType
from smartnsq.ordered import go_partition, java_hash_code, java_partition, sharder_for

# Published MurmurHash3 x86_32 test vectors (seed 0), as unsigned 32-bit values.
MURMUR3_X86_32_SEED0 = {
    b"": 0x00000000,
    b"hello": 0x248BFA47,
    b"Hello, world!": 0xC0363E43,
    b"The quick brown fox jumps over the lazy dog": 0x2E4FF723,
}


@pytest.mark.parametrize(("key", "hashed"), MURMUR3_X86_32_SEED0.items())
@pytest.mark.parametrize("partitions", [1, 2, 3, 4, 7, 10, 1023])
def test_go_mapping_matches_murmur3_vectors(key, hashed, partitions):
    assert go_partition(key, partitions) == hashed % partitions
    assert go_partition(key.decode(), partitions) == hashed % partitions  # str keys: UTF-8


def test_int_keys_hash_their_decimal_digits():
    assert go_partition(12345, 7) == go_partition(b"12345", 7)


@pytest.mark.parametrize(
    ("key", "expected"),
    [("hello", 99162322), ("", 0), ("Aa", 2112), ("BB", 2112), ("polygenelubricants", -(2**31))],
)
def test_java_string_hash(key, expected):
    assert java_hash_code(key) == expected


@pytest.mark.parametrize(
    ("key", "expected"), [(5, 5), (-1, 0), (2**40 + 5, 261), (2**63 - 1, -(2**31))]
)
def test_java_long_hash(key, expected):
    assert java_hash_code(key) == expected


def test_java_partition_is_abs_of_java_remainder():
    # Java: abs(-2147483648 % 7) == abs(-2) == 2
    assert java_partition("polygenelubricants", 7) == 2
    assert java_partition("hello", 4) == 99162322 % 4


def test_sharder_selection():
    assert sharder_for("go") is go_partition
    assert sharder_for("java") is java_partition
    custom = lambda key, n: 0  # noqa: E731
    assert sharder_for(custom) is custom
    with pytest.raises(InvalidArgument):
        sharder_for("python")  # type: ignore[arg-type]
    with pytest.raises(InvalidType):
        go_partition(1.5, 2)  # type: ignore[arg-type]


def test_java_mapping_refuses_bytes_that_are_not_utf8():
    # A Java String has no twin for them: a typed error, not a bare UnicodeDecodeError.
    with pytest.raises(InvalidArgument, match="not UTF-8"):
        java_partition(b"\xff\xfe", 4)
    assert java_partition("héllo".encode(), 4) == java_partition("héllo", 4)
    assert go_partition(b"\xff\xfe", 4) == go_partition(b"\xff\xfe", 4)  # go hashes bytes


@pytest.mark.parametrize("key", [2**63, -(2**63) - 1, 2**64])
def test_java_mapping_refuses_ints_outside_javas_long(key):
    # 2**64 used to wrap silently onto the partition of 0.
    with pytest.raises(InvalidArgument, match="long range"):
        java_partition(key, 4)
    go_partition(key, 4)  # the go mapping hashes the decimal digits of any int


@pytest.mark.parametrize("key", [2**63 - 1, -(2**63)])
def test_java_mapping_takes_the_ends_of_javas_long(key):
    assert 0 <= java_partition(key, 7) < 7


@pytest.mark.parametrize("key", [b"\xff", 2**63])
def test_producer_refuses_a_bad_java_key_before_sending(key):
    from smartnsq.sync import Producer

    # The lookupd address is never asked: the key is checked before anything is sent.
    with Producer(lookupd_http_addresses=["127.0.0.1:1"], sharding="java") as producer:
        with pytest.raises(InvalidArgument):
            producer.publish("orders", b"x", sharding_key=key)
        with pytest.raises(InvalidArgument):
            producer.publish_many("orders", [b"x"], sharding_key=key)
