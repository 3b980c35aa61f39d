"""pub, tail and stat against Youzan's HA fork: partitions, sharding keys, leaders, replicas."""

from __future__ import annotations

import itertools
import json
import signal
from collections import Counter

import anyio
import pytest

from compat.youzan import create_topic
from smartnsq import Producer
from smartnsq.ordered import go_partition
from tests.cli.clihelp import addresses, lines_of, run_cli, spawn_cli, wait_exit
from tests.helpers import topic_stats, unique, wait_for

pytestmark = pytest.mark.integration


def _partition_leaders(info: dict) -> dict[int, str]:
    return {
        int(p): f"{n['broadcast_address']}:{n['tcp_port']}" for p, n in info["partitions"].items()
    }


def _stat(cluster, topic: str) -> dict:
    result = run_cli("stat", *addresses(cluster), "--json", "--interval", "0.2", topic)
    assert result.returncode == 0, result.stderr
    (found,) = json.loads(result.stdout)["topics"]
    return found


def _channel_depths(topic_stat: dict, channel: str = "ch") -> dict[int, int]:
    return {
        p["partition"]: next(c["depth"] for c in p["channels"] if c["channel"] == channel)
        for p in topic_stat["partitions"]
    }


def test_pub_key_field_lands_like_the_producer_and_tail_shows_the_partition(youzan_cluster):
    topic = unique("cli_yz")
    info = create_topic(youzan_cluster, topic, partitions=2, replicas=1, channel="ch")
    users = [f"user-{i}" for i in range(40)]
    lines = [json.dumps({"user": u, "n": i}) for i, u in enumerate(users)]
    pub = run_cli(
        "pub", *addresses(youzan_cluster), "--key-field", "user", topic,
        input=lines_of(*lines, "not json", '{"user": [1]}'),
    )  # fmt: skip
    # The two bad lines are counted in one line (the first one named) and make the exit
    # status 1; --json lists each.
    assert pub.returncode == 1
    assert pub.stderr.decode().splitlines() == [
        f"smartnsq pub: published 40 messages to {topic}, 2 failed (first: <stdin> line 41: "
        "not JSON, so no --key-field user; --json lists them); acknowledged up to <stdin>:40: "
        "go on with --resume-from 40"
    ]
    expected = Counter(go_partition(u, 2) for u in users)
    assert set(expected) == {0, 1}  # the keys really spread over both partitions

    # stat: per-partition depth, and the leaders lookupd names.
    wait_for(lambda: _channel_depths(_stat(youzan_cluster, topic)) == expected, what="depths")
    found = _stat(youzan_cluster, topic)
    assert found["partitioned"] and found["messages"] == 40
    (channel,) = found["channels"]
    assert channel["lag"] == 40 and channel["lag_by_partition"] == {
        str(p): n for p, n in expected.items()
    }
    leaders = _partition_leaders(info)
    assert {p["partition"]: p["leader"] for p in found["partitions"]} == leaders

    tail = run_cli(
        "tail", *addresses(youzan_cluster), "--channel", "ch", "-n", "40", "--json",
        "--show-meta", topic,
    )  # fmt: skip
    assert tail.returncode == 0, tail.stderr
    records = [json.loads(line) for line in tail.stdout.splitlines()]
    assert sorted(r["body"] for r in records) == sorted(lines)
    for r in records:
        user = json.loads(r["body"])["user"]
        assert r["partition"] == go_partition(user, 2), r
        assert r["nsqd"] == leaders[r["partition"]]
        assert r["trace_id"] == 0 and r["headers"] == {}
    # Same key, same partition, in order.
    ns = [json.loads(r["body"])["n"] for r in records if r["partition"] == 0]
    assert ns == sorted(ns)


def test_pub_key_and_trace_and_stat_replicas(youzan_cluster):
    topic = unique("cli_yzr")
    info = create_topic(
        youzan_cluster, topic, partitions=2, replicas=2, channel="ch", multipart=True
    )
    key = "the-one-key"
    pub = run_cli(
        "pub", *addresses(youzan_cluster), "--key", key, "--trace", topic,
        input=lines_of(*(f"m{i}" for i in range(10))),
    )  # fmt: skip
    assert pub.returncode == 0, pub.stderr
    # --trace logs the trace record of each acknowledged batch (one MPUB here).
    traces = [line for line in pub.stderr.decode().splitlines() if "publish" in line]
    assert len(traces) == 1 and "'count': 10" in traces[0] and "trace_id" in traces[0]

    wanted = go_partition(key, 2)
    # --partition names the other partition outright.
    other = run_cli(
        "pub", *addresses(youzan_cluster), "--partition", str(1 - wanted), topic,
        input=lines_of("p1", "p2", "p3"),
    )  # fmt: skip
    assert other.returncode == 0, other.stderr
    expected = {wanted: 10, 1 - wanted: 3}
    wait_for(lambda: _channel_depths(_stat(youzan_cluster, topic)) == expected, what="depths")
    found = _stat(youzan_cluster, topic)
    nodes = sorted(d.tcp for d in youzan_cluster.nsqd)
    leaders = _partition_leaders(info)
    for part in found["partitions"]:
        # Two replicas of each partition, one on each nsqd; the leader is lookupd's.
        assert sorted(part["replicas"]) == nodes
        assert part["leader"] == leaders[part["partition"]]
    assert found["channels"] == [
        {**found["channels"][0], "channel": "ch", "depth": 13, "messages": 13}
    ]

    table = run_cli("stat", *addresses(youzan_cluster), "--interval", "0.2", topic)
    assert table.returncode == 0, table.stderr
    row = next(r for r in table.stdout.decode().splitlines() if topic in r and f"│ {wanted} " in r)
    cells = [c.strip() for c in row.split("│")]
    assert cells[3] == leaders[wanted] and cells[4] == leaders[1 - wanted]  # leader, replica


def test_stat_depth_is_in_messages_on_youzan_bytes_apart(youzan_cluster):
    """The fork's topic depth is its data size in bytes: it was shown in the depth column,
    which means messages everywhere else."""
    topic = unique("cli_ysd")
    create_topic(youzan_cluster, topic, partitions=2, replicas=1, channel="ch")
    for p, n in ((0, 30), (1, 5)):
        pub = run_cli(
            "pub", *addresses(youzan_cluster), "--partition", str(p), topic,
            input=lines_of(*(f"m{i}" for i in range(n))),
        )  # fmt: skip
        assert pub.returncode == 0, pub.stderr
    wait_for(lambda: _channel_depths(_stat(youzan_cluster, topic)) == {0: 30, 1: 5}, what="depth")
    found = _stat(youzan_cluster, topic)
    depths = {
        p["partition"]: (p["depth"], p["disk_depth"], p["messages"]) for p in found["partitions"]
    }
    assert depths == {0: (30, 30, 30), 1: (5, 5, 5)}
    assert (found["depth"], found["messages"]) == (35, 35)
    sizes = {p["partition"]: p["bytes"] for p in found["partitions"]}
    assert sizes[0] > 30 * len("m10") and found["bytes"] == sizes[0] + sizes[1]
    (channel,) = found["channels"]
    assert (channel["depth"], channel["lag"]) == (35, 35) and channel["bytes"] == found["bytes"]

    table = run_cli("stat", *addresses(youzan_cluster), "--interval", "0.2", topic)
    assert table.returncode == 0, table.stderr
    row = next(r for r in table.stdout.decode().splitlines() if topic in r and "│ 0 " in r)
    cells = [c.strip() for c in row.split("│")]
    assert cells[5:8] == ["30", "0", "30"]  # depth, mem, disk: messages
    assert cells[8] == f"{sizes[0]:,}"  # bytes


def test_pub_key_through_nsqd_alone_on_youzan_asks_for_lookupd(youzan_cluster):
    # The partition count comes from lookupd: without it a key cannot pick a partition.
    nsqd = youzan_cluster.nsqd[0]
    pub = run_cli("pub", "--nsqd", nsqd.tcp, "--key", "k", unique("cli_yzkey"), input=b"x\n")
    assert pub.returncode == 1
    err = pub.stderr.decode()
    assert err.count("\n") == 1 and "Youzan nsqd" in err and "give --lookupd" in err, err
    assert "lookupd_http_addresses" not in err and "sharding_key" not in err


def test_to_nsq_keeps_headers_and_trace_ids_on_youzan_ext_topics(youzan_cluster):
    src, dst = unique("cli_yzdead"), unique("cli_yzdst")
    create_topic(youzan_cluster, src, partitions=1, replicas=1, ext=True, channel="replay")
    create_topic(youzan_cluster, dst, partitions=1, replicas=1, ext=True, channel="ch")
    lookupd = [d.http for d in youzan_cluster.lookupd]

    async def publish() -> None:
        async with Producer(lookupd_http_addresses=lookupd) as producer:
            for i in range(3):
                await producer.publish(
                    src, b"m%d" % i, headers={"order": str(i)}, trace_id=1000 + i
                )

    anyio.run(publish)
    copy = run_cli(
        "to-nsq", src, *addresses(youzan_cluster), "--channel", "replay", "--to", dst,
        "--limit", "3", "--json",
    )  # fmt: skip
    assert copy.returncode == 0, copy.stderr
    assert json.loads(copy.stdout)["published"] == 3
    tail = run_cli(
        "tail", *addresses(youzan_cluster), "--channel", "ch", "-n", "3", "--json",
        "--show-meta", dst,
    )  # fmt: skip
    records = sorted((json.loads(x) for x in tail.stdout.splitlines()), key=lambda r: r["body"])
    assert [r["body"] for r in records] == ["m0", "m1", "m2"]
    assert [r["headers"].get("order") for r in records] == ["0", "1", "2"]
    assert [r["trace_id"] for r in records] == [1000, 1001, 1002]


def _inversions(records: list[dict]) -> dict[str, int]:
    """Per key: copies that came after a later message of the same key, by destination
    (partition, offset)."""
    by_key: dict[str, list[tuple[int, int, int]]] = {}
    for r in records:
        h = r["headers"]
        by_key.setdefault(h["key"], []).append((r["partition"], r["offset"], int(h["seq"])))
    out = {}
    for key, rows in by_key.items():
        seqs = [seq for _, _, seq in sorted(rows)]
        out[key] = sum(1 for a, b in itertools.pairwise(seqs) if b < a)
    return out


@pytest.mark.parametrize(
    "route", [["--key-header", "key"], ["--same-partition"]], ids=["key-header", "same-partition"]
)
def test_to_nsq_by_key_keeps_each_keys_order(youzan_cluster, route):
    src, dst = unique("cli_yzkeysrc"), unique("cli_yzkeydst")
    create_topic(youzan_cluster, src, partitions=2, replicas=1, ext=True, channel="copy")
    create_topic(
        youzan_cluster, dst, partitions=2, replicas=1, ext=True, ordered=True, channel="ch"
    )
    lookupd = [d.http for d in youzan_cluster.lookupd]
    keys = [f"k{i}" for i in range(6)]
    per_key = 40

    async def publish() -> None:
        async with Producer(lookupd_http_addresses=lookupd) as producer:
            for seq in range(per_key):
                for key in keys:
                    body = f"{key}-{seq}".encode()
                    headers = {"key": key, "seq": str(seq)}
                    await producer.publish(src, body, sharding_key=key, headers=headers)

    anyio.run(publish)
    total = per_key * len(keys)
    copy = run_cli(
        "to-nsq", src, *addresses(youzan_cluster), "--channel", "copy", "--to", dst,
        *route, "--limit", str(total), "--json", timeout=120,
    )  # fmt: skip
    assert copy.returncode == 0, copy.stderr
    assert json.loads(copy.stdout)["published"] == total
    tail = run_cli(
        "tail", *addresses(youzan_cluster), "--channel", "ch", "-n", str(total), "--json",
        "--show-meta", dst, timeout=120,
    )  # fmt: skip
    assert tail.returncode == 0, tail.stderr
    records = [json.loads(x) for x in tail.stdout.splitlines()]
    assert Counter(r["headers"]["key"] for r in records) == dict.fromkeys(keys, per_key)
    assert _inversions(records) == dict.fromkeys(keys, 0)


def test_to_nsq_to_a_topic_missing_on_the_fork_ends_at_once(youzan_cluster):
    src, dst = unique("cli_yzmsrc"), unique("cli_yzmissing")
    create_topic(youzan_cluster, src, partitions=1, replicas=1, channel="copy")
    lookupd = [d.http for d in youzan_cluster.lookupd]

    async def publish() -> None:
        async with Producer(lookupd_http_addresses=lookupd) as producer:
            await producer.publish_many(src, [b"a", b"b", b"c"])

    anyio.run(publish)
    copy = run_cli(
        "to-nsq", src, *addresses(youzan_cluster), "--channel", "copy", "--to", dst, "--json",
        timeout=30,
    )  # fmt: skip
    assert copy.returncode == 1, copy.stderr
    err = copy.stderr.decode()
    assert dst in err and "does not exist" in err, err
    summary = json.loads(copy.stdout)
    assert summary["published"] == 0 and summary["status"] == "failed"


def _messages(cluster, topic: str) -> int:
    return sum(
        int((topic_stats(d.http, topic) or {}).get("message_count", 0)) for d in cluster.nsqd
    )


def test_to_nsq_by_partition_gives_the_waiting_copies_back_at_once_on_ctrl_c(youzan_cluster):
    # The messages waiting behind their partition's copy in flight when Ctrl-C came are
    # given back untouched (no 90 s requeue delay): a run right after copies them all.
    src, dst = unique("cli_yzstopsrc"), unique("cli_yzstopdst")
    create_topic(youzan_cluster, src, partitions=1, replicas=1, channel="copy")
    create_topic(youzan_cluster, dst, partitions=1, replicas=1, channel="ch")
    lookupd = [d.http for d in youzan_cluster.lookupd]
    total = 100

    async def publish() -> None:
        async with Producer(lookupd_http_addresses=lookupd) as producer:
            await producer.publish_many(src, [f"m{i}".encode() for i in range(total)])

    anyio.run(publish)
    copy = ["to-nsq", src, *addresses(youzan_cluster), "--channel", "copy", "--to", dst]
    proc = spawn_cli(*copy, "--same-partition", "--rate", "20", "--json")
    wait_for(lambda: _messages(youzan_cluster, dst) >= 5, what="the first copies")
    proc.send_signal(signal.SIGINT)
    assert wait_exit(proc) == 130, proc.stderr.read() if proc.stderr else b""
    copied = json.loads(proc.communicate()[0])["published"]
    rest = run_cli(
        *copy, "--same-partition", "--limit", str(total - copied), "--idle-timeout", "5s",
        "--json", timeout=60,
    )  # fmt: skip
    assert rest.returncode == 0, rest.stderr
    assert json.loads(rest.stdout)["published"] == total - copied
    assert _messages(youzan_cluster, dst) >= total
