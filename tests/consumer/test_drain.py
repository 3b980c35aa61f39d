"""Graceful stops under a steady flow leave nothing in flight, on both kinds of nsqd.

A message nsqd's sender took just before RDY 0 reached it can follow the CLOSE_WAIT (in
0.4-7 % of such stops, measured); the stop reads for it and requeues it. One left unread
would stay in flight until nsqd's 60 s message timeout, so the last consumer here, which
must see every message within 20 s, would miss it. Most such messages come in the same read
as the CLOSE_WAIT, so this guards the guarantee on real servers rather than the wait itself;
tests/reliability/test_stop_straggler.py sends a later one every time.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from compat.youzan import create_topic
from smartnsq import Consumer, Message, Producer
from tests.helpers import lookupds, unique, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),
]

STOPS = 20


@pytest.mark.parametrize("kind", ["classic", "youzan"])
async def test_stops_under_a_steady_flow_leave_nothing_in_flight(
    request: pytest.FixtureRequest, kind: str, anyio_backend: str
) -> None:
    cluster = request.getfixturevalue(f"{kind}_cluster")
    topic = unique("stopflow")
    where: dict[str, Any]
    if kind == "youzan":
        create_topic(cluster, topic, partitions=1, replicas=1, channel="ch")
        where = {"lookupd_http_addresses": lookupds(cluster)}
    else:
        where = {"nsqd_tcp_addresses": [cluster.nsqd[0].tcp]}
    sent: set[bytes] = set()
    seen: set[bytes] = set()
    handled = [0]  # by the consumer of this round

    async def handler(message: Message) -> None:
        seen.add(message.body)
        handled[0] += 1

    async def publish(producer: Producer, flowing: anyio.Event) -> None:
        n = 0
        while True:
            batch = [b"m%d" % i for i in range(n, n + 20)]
            n += 20
            await producer.publish_many(topic, batch)
            sent.update(batch)
            if n >= 200:
                flowing.set()

    producer = Producer(**where)
    async with producer, anyio.create_task_group() as tg:
        flowing = anyio.Event()
        tg.start_soon(publish, producer, flowing)
        await flowing.wait()
        for _ in range(STOPS):
            handled[0] = 0
            async with Consumer(topic, "ch", handler, max_in_flight=50, **where):
                await wait_until(lambda: handled[0] >= 20, 20, "20 handled")
        tg.cancel_scope.cancel()
    async with Consumer(topic, "ch", handler, max_in_flight=200, **where):
        await wait_until(lambda: seen >= sent, 20, "every message seen")
