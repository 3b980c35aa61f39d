"""Client-side body compression of Youzan's go-nsq, sans-IO.

go-nsq can compress the body of an ext publish itself (``TopicsForCompress``): the message
then carries the ext headers ``nsq.client.compress`` (codec number as a JSON string: ``"1"``
gzip stream, ``"2"`` snappy raw block, ``"3"`` lz4 raw block without size prefix, ``"0"``
none) and ``nsq.msg.size`` (the original length, which lz4 needs to decompress). nsqd stores
and delivers the compressed bytes; consumers decompress. An lz4 body that does not shrink is
sent as it is, without the headers.

snappy and lz4 are imported on first use, so ``import smartnsq`` does not load them.
"""

from __future__ import annotations

import gzip
from typing import Any

from smartnsq.errors import (
    CodecUnavailable,
    DecompressFailed,
    InvalidArgument,
    InvalidType,
    NSQError,
)
from smartnsq.protocol.message import RawMessage

COMPRESS_KEY = "nsq.client.compress"
SIZE_KEY = "nsq.msg.size"
_COMPRESS_KEY_BYTES = COMPRESS_KEY.encode()

CODECS = {"gzip": 1, "snappy": 2, "lz4": 3}
_NAMES = {number: name for name, number in CODECS.items()}
DEFAULT_MIN_SIZE = 20480  # go-nsq's MessageSizeForCompress default
_GUESS_RATIO = 10  # go-nsq's guess of the original size when nsq.msg.size is missing


def check_codec(codec: object, used: bool = True) -> str:
    """``codec`` checked: one of :data:`CODECS`, and (when ``used``) its library importable."""
    if not isinstance(codec, str):
        raise InvalidType(f"compress_codec must be a str, not {type(codec).__name__}")
    if codec not in CODECS:
        raise InvalidArgument(
            f"compress_codec must be one of {', '.join(sorted(CODECS))}, not {codec!r}"
        )
    if used:
        _library(codec)
    return codec


def _library(codec: str) -> Any:
    if codec == "snappy":
        import snappy  # type: ignore[import-untyped]

        return snappy
    if codec == "lz4":
        try:
            import lz4.block  # type: ignore[import-untyped]
        except ImportError:
            raise CodecUnavailable(
                "lz4 compression needs the lz4 package: pip install 'smartnsq[lz4]'"
            ) from None
        return lz4.block
    return gzip


def compress_body(codec: str, body: bytes) -> tuple[bytes, dict[str, str]] | None:
    """``body`` compressed as go-nsq does, with the ext headers that say so; ``None`` when
    it is to be sent as it is (an lz4 block that would not be smaller, as go-nsq)."""
    lib = _library(codec)
    if codec == "gzip":
        packed: bytes = lib.compress(body)
    elif codec == "snappy":
        packed = lib.compress(body)
    else:
        packed = lib.compress(body, store_size=False)
        if len(packed) >= len(body):
            return None
    return packed, {COMPRESS_KEY: str(CODECS[codec]), SIZE_KEY: str(len(body))}


def maybe_compressed(ext: bytes | None) -> bool:
    """Cheap test on the raw ext header: whether it may name a compression codec."""
    return ext is not None and _COMPRESS_KEY_BYTES in ext


def decompress_body(headers: dict[str, Any], body: bytes) -> bytes:
    """The original body of a message with these ext ``headers``; raises
    :class:`DecompressFailed` for an unknown codec or a corrupt block."""
    value = headers.get(COMPRESS_KEY)
    if value is None or value == "":
        return body  # go-nsq: no (or an empty) codec header means not compressed
    number = _int_header(COMPRESS_KEY, value)
    if number == 0:
        return body
    codec = _NAMES.get(number)
    if codec is None:
        raise DecompressFailed(f"unknown compression codec {value!r} in header {COMPRESS_KEY}")
    lib = _library(codec)
    try:
        if codec == "gzip":
            out: bytes = lib.decompress(body)
        elif codec == "snappy":
            out = lib.decompress(body)
        else:
            size = headers.get(SIZE_KEY)
            limit = len(body) * _GUESS_RATIO if size is None else _int_header(SIZE_KEY, size)
            out = lib.decompress(body, uncompressed_size=limit)
    except DecompressFailed:
        raise
    except Exception as exc:  # each library has its own errors: zlib.error, LZ4BlockError...
        raise DecompressFailed(f"{codec} body cannot be decompressed: {exc}") from exc
    return out


def _int_header(key: str, value: object) -> int:
    if isinstance(value, str) and value.isdigit() and value.isascii():
        return int(value)
    raise DecompressFailed(f"ext header {key} must be a decimal string, not {value!r}")


def unpack(msg: RawMessage) -> NSQError | None:
    """Give ``msg`` its original body if it came compressed; the error when it cannot."""
    try:
        msg.body = decompress_body(msg.headers, msg.body)
    except NSQError as exc:  # also a header that is not JSON (ProtocolError)
        return exc
    return None
