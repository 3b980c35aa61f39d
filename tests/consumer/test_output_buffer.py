"""output_buffer_timeout / output_buffer_size: checked against nsqd's limits, sent in
IDENTIFY (nsqd's /stats shows them per client), and a low-rate consumer gets each message
well inside nsqd's default 250 ms flush when the timeout is small."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from smartnsq import Connection, Consumer, Message, Producer
from smartnsq.errors import InvalidArgument, InvalidType
from smartnsq.sync import Consumer as SyncConsumer
from tests.helpers import create_channel, unique, wait_until

ADDR = ["127.0.0.1:4150"]


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"output_buffer_timeout": 0.0005}, InvalidArgument, "at least 0.001 seconds"),
        ({"output_buffer_timeout": -1}, InvalidArgument, "output_buffer_timeout must be >= 0"),
        ({"output_buffer_timeout": "1"}, InvalidType, "output_buffer_timeout must be a number"),
        ({"output_buffer_size": 10}, InvalidArgument, "at least 64 bytes"),
        ({"output_buffer_size": 1.5}, InvalidType, "output_buffer_size must be an int"),
    ],
)
def test_what_no_nsqd_accepts_raises_before_anything_is_sent(
    options: dict[str, Any], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        Consumer("t", "c", nsqd_tcp_addresses=ADDR, **options)
    with pytest.raises(error, match=words):
        SyncConsumer("t", "c", nsqd_tcp_addresses=ADDR, **options).start()


@pytest.mark.parametrize(
    ("options", "sent"),
    [
        ({}, {}),
        (
            {"output_buffer_timeout": 0.05, "output_buffer_size": 4096},
            {"output_buffer_timeout": 50, "output_buffer_size": 4096},
        ),
        (
            {"output_buffer_timeout": 0, "output_buffer_size": 0},
            {
                "output_buffer_timeout": -1,
                "output_buffer_size": -1,
            },
        ),
    ],
)
def test_identify_carries_them(options: dict[str, Any], sent: dict[str, int]) -> None:
    body = Consumer("t", "c", nsqd_tcp_addresses=ADDR, **options).connection_config.identify_body()
    assert {k: v for k, v in body.items() if k.startswith("output_buffer")} == sent


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize(
    ("options", "applied"),
    [
        ({"output_buffer_timeout": 0.05, "output_buffer_size": 4096}, (4096, 50)),
        ({"output_buffer_timeout": 0}, (16384, 0)),  # 0: nsqd flushes every write
        ({}, (16384, 250)),
    ],
)
async def test_nsqd_applies_them(
    classic_cluster: Any, anyio_backend: str, options: dict[str, Any], applied: tuple[int, int]
) -> None:
    """nsqd's IDENTIFY reply says what it applied to the connection."""
    nsqd = classic_cluster.nsqd[0]
    config = Consumer("t", "c", nsqd_tcp_addresses=[nsqd.tcp], **options).connection_config
    conn = await Connection.open(nsqd.tcp, config)
    try:
        raw = conn.features.raw
        assert (raw["output_buffer_size"], raw["output_buffer_timeout"]) == applied, raw
        assert conn.features.output_buffer_timeout == applied[1] / 1000
    finally:
        await conn.close(timeout=0)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_small_timeout_delivers_a_low_rate_well_inside_250ms(
    classic_cluster: Any, anyio_backend: str
) -> None:
    # With RDY to spare, nsqd writes a lone message out on its flush timer (250 ms by
    # default, so 125 ms late on average); RDY 100 keeps it from flushing for a full RDY.
    nsqd = classic_cluster.nsqd[0]
    topic = unique("obuf_rate")
    create_channel(nsqd.http, topic, "c")
    arrived: list[float] = []
    got = anyio.Event()

    async def handle(message: Message) -> None:
        arrived.append(time.monotonic())
        got.set()

    latencies = []
    async with (
        Producer([nsqd.tcp]) as producer,
        Consumer(
            topic,
            "c",
            handle,
            nsqd_tcp_addresses=[nsqd.tcp],
            max_in_flight=100,
            output_buffer_timeout=0.025,
        ) as consumer,
    ):
        await wait_until(lambda: consumer.stats().connections == 1, 10, "subscribed")
        await wait_until(lambda: consumer.stats().nodes and consumer.max_in_flight, 10, "RDY")
        for i in range(8):
            got = anyio.Event()
            sent = time.monotonic()
            await producer.publish(topic, b"%d" % i)
            with anyio.fail_after(5):
                await got.wait()
            latencies.append(arrived[-1] - sent)
    assert max(latencies) < 0.15, latencies


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_nsqds_own_limits_decide(cluster_factory: Any, anyio_backend: str) -> None:
    cluster = cluster_factory("classic", nsqd_args=["--min-output-buffer-timeout=1ms"])
    nsqd = cluster.nsqd[0]
    async with Consumer(
        unique("obuf_low"), "c", nsqd_tcp_addresses=[nsqd.tcp], output_buffer_timeout=0.001
    ) as consumer:
        await wait_until(lambda: consumer.stats().connections == 1, 10, "subscribed")
        assert consumer.last_error is None
