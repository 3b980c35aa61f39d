"""go-nsq's client-side compression against the real Youzan HA cluster.

The foreign producer here is nsqd's own HTTP ``/pub_ext``, with bodies compressed by the codec
libraries directly and headers written from the fork's documented format, so nothing of
smartnsq's encoding is involved on that side.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import urllib.parse
import urllib.request

import anyio
import lz4.block
import pytest
import snappy

from compat.youzan import create_topic, lookup
from smartnsq import ConnectionConfig, Consumer, Message, Producer
from smartnsq import sync as smartsync
from smartnsq.errors import DecompressFailed, ExtNotSupported
from smartnsq.protocol.message import MessageLayout
from tests.helpers import drain, lookupds, unique, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),
]

EXT = MessageLayout(binary_id=True, ext=True)
EXT_CONFIG = ConnectionConfig(extend_support=True)
LEN = 30_000  # above go-nsq's default threshold (20480)


def _text(n: int, seed: int) -> bytes:
    """Compressible bytes of length ``n``."""
    words = [b"alpha", b"beta", b"gamma", b"delta", b"%d" % seed]
    out = b" ".join(words[(i * 7 + seed) % 5] for i in range(n // 4))
    return out[:n]


def _leader(cluster, topic: str) -> tuple[str, str]:
    """(tcp, http) of the leader nsqd of partition 0."""
    node = lookup(cluster.lookupd[0].http, topic, "w")["partitions"]["0"]
    host = node["broadcast_address"]
    return f"{host}:{node['tcp_port']}", f"{host}:{node['http_port']}"


def _pub_ext(http: str, topic: str, body: bytes, headers: dict[str, str]) -> None:
    """Publish through nsqd's HTTP /pub_ext (the fork's other ext publish path)."""
    q = urllib.parse.urlencode({"topic": topic, "partition": "0", "ext": json.dumps(headers)})
    req = urllib.request.Request(f"http://{http}/pub_ext?{q}", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200, resp.read()


def _compressed(codec: str, body: bytes) -> tuple[bytes, dict[str, str]]:
    if codec == "gzip":
        return gzip.compress(body), {"nsq.client.compress": "1", "nsq.msg.size": str(len(body))}
    if codec == "snappy":
        return snappy.compress(body), {"nsq.client.compress": "2", "nsq.msg.size": str(len(body))}
    packed = lz4.block.compress(body, store_size=False)
    return packed, {"nsq.client.compress": "3", "nsq.msg.size": str(len(body))}


@pytest.fixture(scope="module")
def ext_topic(youzan_cluster):
    topic = unique("yzc")
    create_topic(youzan_cluster, topic, partitions=1, replicas=1, ext=True, channel="ch")
    return topic


async def test_foreign_compressed_bodies_reach_the_handler_decompressed(
    youzan_cluster, anyio_backend
):
    topic = unique("yzc")
    create_topic(youzan_cluster, topic, partitions=1, replicas=1, ext=True, channel="ch")
    _, http = _leader(youzan_cluster, topic)
    sent: dict[str, tuple[bytes, dict[str, str]]] = {}
    for i, codec in enumerate(["gzip", "snappy", "lz4"]):
        original = _text(LEN, i)
        packed, headers = _compressed(codec, original)
        assert len(packed) < len(original) // 2
        headers = {"user": codec, **headers}
        _pub_ext(http, topic, packed, headers)
        sent[codec] = (original, headers)
    # go-nsq sends an lz4 body that does not shrink raw, without the headers; "0" is none
    raw = os.urandom(LEN)
    _pub_ext(http, topic, raw, {"user": "raw"})
    _pub_ext(http, topic, b"plain", {"user": "none", "nsq.client.compress": "0"})

    got: dict[str, Message] = {}
    done = anyio.Event()

    async def handle(message: Message) -> None:
        got[message.headers["user"]] = message
        if len(got) == 5:
            done.set()

    async with Consumer(
        topic, "ch", handle, lookupd_http_addresses=lookupds(youzan_cluster), max_in_flight=10
    ):
        with anyio.fail_after(30):
            await done.wait()
    for codec, (original, headers) in sent.items():
        assert got[codec].body == original, codec
        assert got[codec].headers == headers  # as go-nsq: the codec headers stay visible
    assert got["raw"].body == raw
    assert got["none"].body == b"plain"


async def test_blocking_consumer_decompresses_too(youzan_cluster, ext_topic, anyio_backend):
    _, http = _leader(youzan_cluster, ext_topic)
    original = _text(LEN, 7)
    packed, headers = _compressed("snappy", original)
    _pub_ext(http, ext_topic, packed, {"user": "sync", **headers})
    with smartsync.Consumer(
        ext_topic, "ch", lookupd_http_addresses=lookupds(youzan_cluster)
    ) as consumer:
        message = next(iter(consumer))
        assert message.body == original
        assert message.headers["user"] == "sync"


async def test_bad_compressed_body_fails_like_a_handler_failure(
    youzan_cluster, anyio_backend, caplog
):
    caplog.set_level(logging.WARNING, logger="smartnsq")
    topic = unique("yzc")
    create_topic(youzan_cluster, topic, partitions=1, replicas=1, ext=True, channel="ch")
    _, http = _leader(youzan_cluster, topic)
    _pub_ext(http, topic, b"\xff" * 64, {"user": "corrupt", "nsq.client.compress": "2"})
    _pub_ext(http, topic, b"x" * 64, {"user": "unknown", "nsq.client.compress": "9"})
    _pub_ext(http, topic, b"\x00" * 64, {"user": "lz4", "nsq.client.compress": "3"})
    good, headers = _compressed("gzip", _text(LEN, 3))
    _pub_ext(http, topic, good, {"user": "good", **headers})

    handled: list[str] = []
    given_up: dict[str, int] = {}
    all_given_up = anyio.Event()

    def on_giving_up(message: Message) -> None:
        given_up[message.headers["user"]] = message.attempts
        if len(given_up) == 3:
            all_given_up.set()

    async with Consumer(
        topic,
        "ch",
        lambda m: handled.append(m.headers["user"]),
        lookupd_http_addresses=lookupds(youzan_cluster),
        max_in_flight=10,
        max_attempts=2,
        requeue_delay=0,
        backoff=False,
        on_giving_up=on_giving_up,
    ) as consumer:
        with anyio.fail_after(30):
            await all_given_up.wait()
        await wait_until(lambda: "good" in handled, what="the good message")
        stats = consumer.stats()
        # another message still flows on the same connection
        await anyio.to_thread.run_sync(_pub_ext, http, topic, b"after", {"user": "after"})
        await wait_until(lambda: "after" in handled, what="a message after the bad ones")
        assert consumer.stats().connections == 1
    assert handled == ["good", "after"]  # the handler never saw a bad body
    assert given_up == {"corrupt": 3, "unknown": 3, "lz4": 3}
    assert stats.requeued == 6 and stats.connections == 1
    failures = [
        r for r in caplog.records if isinstance(r.exc_info and r.exc_info[1], DecompressFailed)
    ]
    assert len(failures) == 6


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4"])
async def test_smartnsq_compression_is_what_go_nsq_sends(youzan_cluster, codec, anyio_backend):
    topic = unique("yzc")
    create_topic(youzan_cluster, topic, partitions=1, replicas=1, ext=True, channel="ch")
    tcp, _ = _leader(youzan_cluster, topic)
    big, small, noise = _text(LEN, 1), b"small body", os.urandom(LEN)
    many = [_text(LEN, 2), b"tiny"]
    options = dict(compress_topics=[topic], compress_codec=codec)
    async with Producer(lookupd_http_addresses=lookupds(youzan_cluster), **options) as producer:
        await producer.publish(topic, big, headers={"k": "v"})
        await producer.publish(topic, small)
        await producer.publish(topic, noise)
        await producer.publish_many(topic, many)

    def blocking() -> None:
        with smartsync.Producer(lookupd_http_addresses=lookupds(youzan_cluster), **options) as p:
            p.publish(topic, big, tag="t1")

    await anyio.to_thread.run_sync(blocking)
    raw = await drain(tcp, topic, "ch", 6, layout=EXT, config=EXT_CONFIG)
    number = {"gzip": "1", "snappy": "2", "lz4": "3"}[codec]
    size = {"nsq.client.compress": number, "nsq.msg.size": str(LEN)}

    def original(message) -> bytes:
        body = message.body
        if codec == "gzip":
            return gzip.decompress(body)
        if codec == "snappy":
            return snappy.decompress(body)
        return lz4.block.decompress(body, uncompressed_size=LEN)

    first, second, third, fourth, fifth, sixth = raw
    assert first.headers == {"k": "v", **size} and original(first) == big
    assert len(first.body) < LEN // 2
    assert second.ext_version == 0 and second.body == small  # below compress_min_size: PUB
    if codec == "lz4":  # lz4 cannot shrink it: sent as it is, without the headers
        assert third.ext_version == 0 and third.body == noise
    else:
        assert third.headers == size and original(third) == noise
    assert fourth.headers == size and original(fourth) == many[0]
    assert fifth.headers == {} and fifth.body == b"tiny"
    assert sixth.headers == {"##client_dispatch_tag": "t1", **size} and original(sixth) == big


async def test_compressed_publish_to_a_topic_without_ext_is_refused(youzan_cluster, anyio_backend):
    topic = unique("yzc")
    create_topic(youzan_cluster, topic, partitions=1, replicas=1, channel="ch")
    async with Producer(
        lookupd_http_addresses=lookupds(youzan_cluster), compress_topics=[topic]
    ) as producer:
        with pytest.raises(ExtNotSupported, match="ext topic"):
            await producer.publish(topic, _text(LEN, 0))
        await producer.publish(topic, b"small bodies go out plainly")
    tcp, _ = _leader(youzan_cluster, topic)
    raw = await drain(tcp, topic, "ch", 1, until=lambda got: len(got) >= 1)
    assert [m.body for m in raw] == [b"small bodies go out plainly"]
