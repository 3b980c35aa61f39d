"""Producer input handling, without a server: what would be sent, or which error.

The integration tests show the same against a real nsqd; these cover the combinations.
"""

from __future__ import annotations

import array
import struct
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq import Producer
from smartnsq.errors import InvalidArgument, InvalidType, MessageTooLarge
from smartnsq.lookup.model import Node, TopicLayout, TopicMeta
from tests.producer import parts


def capture(**config: Any) -> tuple[Producer, list[bytes]]:
    """A producer whose plain sends are recorded instead of written."""
    producer = Producer(nsqd_tcp_addresses=["127.0.0.1:4150"], **config)
    sent: list[bytes] = []

    async def send(data: bytes, timeout: float | None, count: int = 1) -> bytes:
        sent.append(data)
        return b"OK"

    producer._io._send = send  # type: ignore[method-assign]
    return producer, sent


def publish_many(producer: Producer, bodies: Any) -> None:
    anyio.run(producer.publish_many, "t", bodies)


def as_bytes(body: Any) -> bytes:
    return memoryview(body).tobytes()


def expected(bodies: list[Any]) -> bytes:
    """The MPUB an independent encoder makes of the bodies' bytes."""
    raw = [as_bytes(b) for b in bodies]
    payload = struct.pack(">I", len(raw)) + b"".join(struct.pack(">I", len(b)) + b for b in raw)
    return b"MPUB t\n" + struct.pack(">I", len(payload)) + payload


def wide(values: list[int]) -> memoryview:
    """A memoryview whose len() counts 2-byte items, not bytes."""
    return memoryview(array.array("H", values))


body = st.one_of(
    st.binary(min_size=1, max_size=40),
    st.binary(min_size=1, max_size=40).map(bytearray),
    st.binary(min_size=1, max_size=40).map(memoryview),
    st.binary(min_size=1, max_size=40).map(lambda b: array.array("B", b)),
    st.lists(st.integers(0, 0xFFFF), min_size=1, max_size=20).map(wide),
)


def bytes_like(data: bytes) -> st.SearchStrategy[Any]:
    return st.sampled_from([data, bytearray(data), memoryview(data)])


same_size = st.integers(1, 40).flatmap(
    lambda n: st.lists(
        st.binary(min_size=n, max_size=n).flatmap(bytes_like), min_size=1, max_size=30
    )
)


@settings(max_examples=300)
@given(st.one_of(st.lists(body, min_size=1, max_size=30), same_size))
def test_any_bytes_like_bodies_are_sent_as_their_bytes(bodies):
    producer, sent = capture()
    publish_many(producer, bodies)
    assert sent == [expected(bodies)]


def test_same_length_but_wider_items_are_not_taken_for_bytes():
    # len() is 2 for all three, but the memoryview holds 4 bytes
    bodies: list[Any] = [b"ab", wide([1, 2]), b"cd"]
    producer, sent = capture()
    publish_many(producer, bodies)
    assert sent == [expected(bodies)]


def test_a_wide_memoryview_over_the_size_limit_is_refused():
    producer, sent = capture(max_message_size=100)
    with pytest.raises(MessageTooLarge):
        publish_many(producer, [wide([0] * 60)])  # len 60, 120 bytes
    assert sent == []


@pytest.mark.parametrize(
    ("bodies", "error", "match"),
    [
        (["ab"], InvalidType, "encode it first"),
        ([b"ab", "cd"], InvalidType, "encode it first"),  # same length as the bytes
        ([b"ab", ""], InvalidType, "encode it first"),  # a type error, not an empty one
        ([b"ab", 12], InvalidType, "not int"),
        ([b"ab", None], InvalidType, "not NoneType"),
        ([b"ab", [1, 2]], InvalidType, "not list"),
        ([b"ab", b""], InvalidArgument, "empty"),
        ([b"", b""], InvalidArgument, "empty"),
        ([b"ab", b"x" * 101], MessageTooLarge, "max_message_size"),
        ([b"x" * 101] * 3, MessageTooLarge, "max_message_size"),
        ([], InvalidArgument, "at least one"),
        (b"abc", InvalidType, "not a single body"),
        ("abc", InvalidType, "not a single body"),
    ],
)
def test_bad_input_raises_and_sends_nothing(bodies, error, match):
    producer, sent = capture(max_message_size=100)
    with pytest.raises(error, match=match):
        publish_many(producer, bodies)
    assert sent == []


def test_a_bad_body_in_a_later_batch_stops_every_batch():
    # 3 batches under the body limit; the bad body is in the last one
    producer, sent = capture(max_message_size=100, max_body_size=250)
    with pytest.raises(InvalidType):
        publish_many(producer, [b"x" * 100] * 5 + ["y" * 100])
    assert sent == []


def test_bodies_over_the_body_limit_are_split_in_order():
    producer, sent = capture(max_message_size=100, max_body_size=250)
    bodies = [bytes([65 + i]) * 100 for i in range(5)]
    publish_many(producer, iter(bodies))  # any iterable
    assert sent == [expected(bodies[0:2]), expected(bodies[2:4]), expected(bodies[4:5])]


@pytest.mark.parametrize("body", [bytearray(b"abcd"), array.array("B", b"abcd"), wide([1, 2])])
def test_publish_sends_the_bytes_of_a_bytes_like_body(body):
    producer, sent = capture()
    anyio.run(producer.publish, "t", body)
    raw = as_bytes(body)
    assert sent == [b"PUB t\n" + struct.pack(">I", len(raw)) + raw]


def test_round_robin_gives_every_partition_its_turn_when_one_nsqd_leads_several():
    """Unkeyed publishes take turns over partitions, not nsqd: partitions 0 and 2 on one
    nsqd each get a third (by address, partition 2 never got a message)."""
    a, b = Node("127.0.0.1", 4150), Node("127.0.0.1", 4250)
    layout = TopicLayout((a, b), {0: a, 1: b, 2: a}, TopicMeta(partition_num=3))
    routes = parts.nodes(nsqd_tcp_addresses=[], lookupd_http_addresses=["127.0.0.1:4161"])
    picks = [routes.pick("t", None, None, layout) for _ in range(6)]
    assert sorted(picks) == sorted([(a.tcp_address, 0), (b.tcp_address, 1), (a.tcp_address, 2)] * 2)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_publish_whose_connection_ended_unanswered_is_not_sent_again(
    anyio_backend: str,
) -> None:
    """The async twin of the blocking Producer's test: nsqd (a fake here: no real nsqd
    closes without answering on cue) reads the second PUB and closes without an answer.
    The publish raises OutcomeUnknown, is not sent again; the next one takes a new
    connection. Before, it was sent again on a new connection: a possible duplicate."""
    import socket
    import threading

    from smartnsq.errors import OutcomeUnknown
    from smartnsq.protocol.frames import FRAME_RESPONSE, encode_frame
    from tests.fakes import accept_identify

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    pubs: list[int] = []

    def serve() -> None:
        for n in (1, 2):
            sock, _ = server.accept()
            with sock:
                data = accept_identify(sock)
                while True:
                    while b"PUB " not in data:
                        chunk = sock.recv(4096)
                        if not chunk:
                            return
                        data += chunk
                    data = data[data.index(b"PUB ") + 4 :]
                    pubs.append(n)
                    if n == 1 and len(pubs) == 2:
                        break
                    sock.sendall(encode_frame(FRAME_RESPONSE, b"OK"))
                    if n == 2:
                        return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    async with Producer([f"127.0.0.1:{port}"], max_retries=3, timeout=5) as producer:
        await producer.publish("t", b"first")
        with pytest.raises(OutcomeUnknown, match="may or may not have been published"):
            await producer.publish("t", b"second")
        assert producer.stats().retried == 0
        await producer.publish("t", b"third")
    await anyio.to_thread.run_sync(thread.join, 5)
    server.close()
    assert pubs == [1, 1, 2]
