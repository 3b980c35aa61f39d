"""Answers made on another thread for an ``async def`` handler's messages: carried to the
loop and handled in the workers' task (the consumer keeps no task of its own for them)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from smartnsq import Consumer, Message, Producer
from tests.helpers import channel_stats, create_channel, unique, wait_until


@pytest.mark.integration
async def test_finish_and_requeue_with_backoff_from_another_thread_reach_nsqd(
    classic_cluster: Any, anyio_backend: str
) -> None:
    nsqd = classic_cluster.nsqd[0]
    topic = unique("thread_answers")
    create_channel(nsqd.http, topic, "c")
    bodies = [b"fin1", b"req", b"fin2"]
    async with Producer(nsqd_tcp_addresses=[nsqd.tcp]) as producer:
        await producer.publish_many(topic, bodies)
    seen: list[tuple[bytes, int]] = []
    threads: list[threading.Thread] = []

    def answer(msg: Message) -> None:
        if msg.body == b"req" and msg.attempts == 1:
            msg.requeue(0, backoff=True)  # a backoff window: the loop must start a task
        else:
            msg.finish()

    async def handler(msg: Message) -> None:
        msg.disable_auto_response()
        seen.append((msg.body, msg.attempts))
        thread = threading.Thread(target=answer, args=(msg,))
        threads.append(thread)
        thread.start()

    def settled() -> bool:
        stats = channel_stats(nsqd.http, topic, "c") or {}
        return stats.get("depth") == 0 and stats.get("in_flight_count") == 0

    async with Consumer(topic, "c", handler, nsqd_tcp_addresses=[nsqd.tcp], backoff_unit=0.05):
        await wait_until(lambda: len(seen) == 4 and settled(), 15, "every answer on the wire")
        for thread in threads:
            thread.join()
    assert sorted(seen) == [(b"fin1", 1), (b"fin2", 1), (b"req", 1), (b"req", 2)]
    stats = channel_stats(nsqd.http, topic, "c")
    assert stats is not None and stats["requeue_count"] == 1 and stats["message_count"] == 3
