"""to-nsq's per-key order: one key's copies one after another, keys in parallel."""

from __future__ import annotations

import anyio
import pytest

from smartnsq.cli.keyorder import KeyOrder

pytestmark = pytest.mark.anyio


async def test_one_keys_copies_go_in_order_and_other_keys_do_not_wait(anyio_backend):
    order = KeyOrder()
    done: list[str] = []
    release = {name: anyio.Event() for name in ("a1", "a2", "b1")}

    async def copy(key: str, name: str, fail: bool = False) -> None:
        turn = order.enter(key)  # taken in arrival order, before anything waits
        try:
            if not await turn.wait_for_previous():
                turn.failed = True
                done.append(name + " requeued")
                return
            await release[name].wait()
            turn.failed = fail
            done.append(name)
        finally:
            order.leave(key, turn)

    async with anyio.create_task_group() as tg:
        for args in (("a", "a1", True), ("a", "a2"), ("b", "b1")):
            tg.start_soon(copy, *args)
            await anyio.wait_all_tasks_blocked()  # arrived (and in line) one after another
        release["a2"].set()  # a2 is ready first, but waits for a1
        release["b1"].set()  # another key: not held up by a
        await anyio.wait_all_tasks_blocked()
        assert done == ["b1"]
        release["a1"].set()
    # a1's copy failed: a2 is not copied ahead of it.
    assert done == ["b1", "a1", "a2 requeued"]
    assert len(order) == 0  # nothing kept once a key's line is empty
