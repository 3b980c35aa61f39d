"""What an idle consumer costs in tasks: each one holds memory for as long as the consumer
runs (~3 KB with anyio's task handle and cancel scope), so a process with 1,000 consumers
pays for every task per connection a thousand times over."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from typing import Any

import pytest

from smartnsq import Consumer, Message
from tests.helpers import create_channel, unique, wait_until

# The consumer's own: the workers' starter, which also handles what other threads send back
# (RDY pacing has a task only while its share is uneven, not in this even one).
PER_CONSUMER = 1
PER_CONNECTION = 1  # the connection's loop, which also reads it and runs its watchdog


async def _handle(message: Message) -> None:
    pass


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_idle_subscribed_connection_costs_one_task(
    classic_cluster: Any, anyio_backend: str
) -> None:
    nsqd = classic_cluster.nsqd[0]
    before = len(asyncio.all_tasks())
    topics = [unique("footprint") for _ in range(3)]
    for topic in topics:
        create_channel(nsqd.http, topic, "c")
    async with AsyncExitStack() as stack:
        consumers = [
            await stack.enter_async_context(
                Consumer(t, "c", _handle, nsqd_tcp_addresses=[nsqd.tcp])
            )
            for t in topics
        ]
        await wait_until(
            lambda: all(c.stats().connections == 1 for c in consumers), 10, "subscribed"
        )
        # Subscribing uses a short-lived task of its own: it is gone once subscribed.
        await wait_until(
            lambda: len(asyncio.all_tasks()) - before <= 3 * (PER_CONSUMER + PER_CONNECTION),
            5,
            "only the long-lived tasks",
        )
        assert len(asyncio.all_tasks()) - before == 3 * (PER_CONSUMER + PER_CONNECTION)
