"""What ``smartnsq stat`` makes of the fork's /stats answers, without a server: answers a
real fork gives only after its retention cleaned a partition up."""

from __future__ import annotations

import io

from rich.console import Console

from smartnsq.cli.stat import render
from smartnsq.cli.statdata import Node, Sample, summarize


def _partition(partition: int, start: int, size: int, count: int) -> dict:
    return {
        "topic_name": "t",
        "topic_partition": str(partition),
        "is_leader": True,
        "backend_start": start,
        "backend_depth": size,
        "depth": size - start,
        "message_count": count,
        "channels": [
            {"channel_name": "c", "depth": 2, "depth_size": 64, "backend_depth": 2,
             "message_count": count},
        ],
    }  # fmt: skip


def test_a_cleaned_up_partition_has_no_depth_in_messages() -> None:
    stats = {"topics": [_partition(0, 0, 320, 10), _partition(1, 96, 320, 10)]}
    snapshot = summarize([Node("n:1")], None, Sample(0.0, {"n:1": stats}))
    (topic,) = snapshot.topics
    parts = {p["partition"]: p for p in topic["partitions"]}
    assert (parts[0]["depth"], parts[0]["bytes"]) == (10, 320)
    assert (parts[1]["depth"], parts[1]["bytes"]) == (None, 224)  # the count there is unknown
    assert (topic["depth"], topic["bytes"], topic["messages"]) == (None, 544, 20)
    (channel,) = topic["channels"]
    assert (channel["depth"], channel["bytes"], channel["lag"]) == (4, 128, 4)
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(render(snapshot))
    row = next(
        r for r in console.export_text().splitlines() if r.startswith("│ t ") and "│ 1 " in r
    )
    assert [c.strip() for c in row.split("│")][5:9] == ["-", "0", "-", "224"]  # depth: not told
