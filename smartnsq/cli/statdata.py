"""What ``smartnsq stat`` shows: nodes from the lookupds, numbers from each nsqd's /stats.

Classic and Youzan nsqd answer /stats alike, except that the fork has one entry per topic
partition (``topic_partition``) on every node holding a replica of it, with ``is_leader`` on
the one that serves it. Totals count leaders only, so replicas are not counted twice. The
fork's topic ``depth`` is in bytes: shown as ``bytes``, beside a depth in messages (what the
partition retains, told only while nothing was cleaned up); a channel's ``depth_size`` too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import anyio

from smartnsq.cli.options import CliError
from smartnsq.errors import NSQError
from smartnsq.lookup.manager import LookupManager
from smartnsq.net.http import HttpClient, HttpError

__all__ = [
    "Node",
    "Sample",
    "Snapshot",
    "find_nodes",
    "get_json",
    "host_port",
    "sample",
    "summarize",
]

ACCEPT = {"Accept": "application/vnd.nsq; version=1.0"}
TIMEOUT = 5.0
MAX_ANSWER = 64 << 20  # /stats of a large nsqd without a topic filter


@dataclass(frozen=True, slots=True)
class Node:
    """One nsqd: its HTTP address (for /stats), and what lookupd says about it."""

    http: str
    tcp: str = ""
    version: str = ""
    hostname: str = ""


@dataclass
class Sample:
    """One round of /stats answers, by node HTTP address, and when it was taken."""

    at: float
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


@dataclass
class Snapshot:
    """The summary that is printed: JSON-ready dictionaries."""

    nodes: list[dict[str, Any]]
    topics: list[dict[str, Any]]
    interval: float


async def get_json(client: HttpClient, url: str) -> Any:
    with anyio.fail_after(TIMEOUT):
        response = await client.get(url, None, ACCEPT, max_size=MAX_ANSWER)
    if response.status != 200:
        raise CliError(f"GET {url}: HTTP {response.status}")
    body = json.loads(response.body or b"null")
    if isinstance(body, dict) and "status_code" in body and "data" in body:
        body = body["data"]  # the legacy envelope
    return body


def host_port(host: str, port: object) -> str:
    """``host:port``, with an IPv6 address in brackets (``[::1]:4151``), as URLs need."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


async def find_nodes(client: HttpClient, lookupds: list[str], nsqd_http: list[str]) -> list[Node]:
    """Every nsqd a lookupd knows (asking each lookupd of the cluster), plus ``nsqd_http``."""
    nodes: dict[str, Node] = {a: Node(http=a) for a in nsqd_http}
    if not lookupds:
        return list(nodes.values())
    try:
        async with LookupManager(lookupds) as manager:
            urls = await manager.discover()
    except NSQError as exc:
        raise CliError(str(exc)) from None
    errors: list[str] = []
    for url in urls:
        try:
            body = await get_json(client, f"{url}/nodes")
        except (CliError, HttpError, TimeoutError, ValueError) as exc:
            errors.append(f"{url}: {exc}")
            continue
        for p in (body or {}).get("producers") or []:
            host = str(p.get("broadcast_address", ""))
            http = host_port(host, p.get("http_port"))
            nodes[http] = Node(
                http=http,
                tcp=host_port(host, p.get("tcp_port")),
                version=str(p.get("version", "")),
                hostname=str(p.get("hostname", "")),
            )
    if len(errors) == len(urls):
        raise CliError("no lookupd answered /nodes: " + "; ".join(errors))
    return list(nodes.values())


async def sample(client: HttpClient, nodes: list[Node], topic: str | None) -> Sample:
    """Ask every node for /stats at once."""
    result = Sample(at=anyio.current_time())
    query = "?format=json" + (f"&topic={topic}" if topic else "")

    async def one(node: Node) -> None:
        try:
            result.stats[node.http] = await get_json(client, f"http://{node.http}/stats{query}")
        except (CliError, HttpError, TimeoutError, ValueError) as exc:
            result.errors[node.http] = str(exc) or type(exc).__name__

    async with anyio.create_task_group() as tg:
        for node in nodes:
            tg.start_soon(one, node)
    return result


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _entries(s: Sample) -> dict[tuple[str, str, int | None], dict[str, Any]]:
    """Topic entries by (node, topic, partition)."""
    out: dict[tuple[str, str, int | None], dict[str, Any]] = {}
    for node, stats in s.stats.items():
        for t in (stats or {}).get("topics") or []:
            part = t.get("topic_partition")
            partition = int(part) if isinstance(part, str) and part.lstrip("-").isdigit() else None
            out[(node, str(t.get("topic_name")), partition)] = t
    return out


def _rate(now: int, before: int | None, dt: float) -> float | None:
    if before is None or dt <= 0:
        return None
    return round(max(0, now - before) / dt, 1)


_CHANNEL_FIELDS = {
    "depth": "depth",
    "disk_depth": "backend_depth",
    "in_flight": "in_flight_count",
    "deferred": "deferred_count",
    "requeued": "requeue_count",
    "timed_out": "timeout_count",
    "messages": "message_count",
}


def _memory_depth(entry: dict[str, Any]) -> int:
    """nsqd reports the depth and the part on disk (``backend_depth``); the rest is in
    memory, as nsq_stat computes it."""
    return max(0, _int(entry.get("depth")) - _int(entry.get("backend_depth")))


def _channel(
    c: dict[str, Any], old: dict[str, Any] | None, dt: float, partitioned: bool
) -> dict[str, Any]:
    row: dict[str, Any] = {k: _int(c.get(v)) for k, v in _CHANNEL_FIELDS.items()}
    row["memory_depth"] = _memory_depth(c)
    row["bytes"] = _int(c.get("depth_size")) if partitioned else None
    # Messages not consumed yet (smartnsq.lag): a Youzan partition's channel depth already
    # counts what is in flight; classic nsqd keeps in-flight and deferred apart from depth.
    row["lag"] = row["depth"] if partitioned else row["depth"] + row["in_flight"] + row["deferred"]
    clients = c.get("clients")
    row["clients"] = len(clients) if isinstance(clients, list) else _int(c.get("client_num"))
    row["paused"] = bool(c.get("paused"))
    row["rate"] = _rate(
        row["messages"], None if old is None else _int(old.get("message_count")), dt
    )
    # What left the channel (nsq_stat's egress): messages that came in, less depth growth.
    row["egress_rate"] = (
        None
        if old is None or row["rate"] is None or dt <= 0
        else round(max(0, row["rate"] * dt - (row["depth"] - _int(old.get("depth")))) / dt, 1)
    )
    return row


def _add(total: dict[str, Any], row: dict[str, Any]) -> None:
    for k, v in row.items():
        if k in ("rate", "egress_rate"):  # None: no earlier sample to compare with
            total[k] = None if v is None else (total.get(k) or 0) + v
        elif k in ("depth", "memory_depth", "disk_depth", "bytes"):  # None: not told
            total[k] = (
                None if v is None or (k in total and total[k] is None) else (total.get(k, 0) + v)
            )
        elif isinstance(v, bool):
            total[k] = total.get(k, False) or v
        elif isinstance(v, int | float):
            total[k] = total.get(k, 0) + v


def summarize(
    nodes: list[Node], first: Sample | None, last: Sample, channel: str | None = None
) -> Snapshot:
    """Nodes, and topics with their partitions and channels (only ``channel`` when given),
    with rates from two samples."""
    dt = last.at - first.at if first is not None else 0.0
    before = _entries(first) if first is not None else {}
    now = _entries(last)
    node_rows = []
    for n in nodes:
        stats = last.stats.get(n.http) or {}
        node_rows.append(
            {
                "http": n.http,
                "tcp": n.tcp or None,
                "hostname": n.hostname or None,
                "version": str(stats.get("version") or n.version) or None,
                "health": stats.get("health") if n.http in last.stats else None,
                "error": last.errors.get(n.http),
                "topics": len({name for (h, name, _) in now if h == n.http}),
            }
        )
    tcp_of = {n.http: n.tcp or n.http for n in nodes}
    topics: dict[str, dict[str, Any]] = {}
    for (node, name, partition), t in sorted(now.items(), key=lambda kv: (kv[0][1], kv[0][2] or 0)):
        old = before.get((node, name, partition))
        topic = topics.setdefault(
            name,
            {
                "topic": name,
                "depth": 0,
                "memory_depth": 0,
                "disk_depth": 0,
                "messages": 0,
                "rate": None,
                "parts": {},
            },
        )
        leader = t.get("is_leader", True) is not False
        key = str(partition) if partition is not None else node
        part = topic["parts"].setdefault(
            key,
            {"partition": partition, "leader": None, "replicas": [], "channels": {}},
        )
        part["replicas"].append(tcp_of.get(node, node))
        if not leader:
            continue
        part["leader"] = tcp_of.get(node, node)
        messages = _int(t.get("message_count"))
        old_messages = None if old is None else _int(old.get("message_count"))
        if partition is None:
            part.update(
                depth=_int(t.get("depth")),
                memory_depth=_memory_depth(t),
                disk_depth=_int(t.get("backend_depth")),
                bytes=None,
            )
        else:  # the fork: every message on disk; depth and backend_depth are bytes
            retained = messages if _int(t.get("backend_start")) == 0 else None
            part.update(
                depth=retained, memory_depth=0, disk_depth=retained, bytes=_int(t.get("depth"))
            )
        part["messages"] = messages
        part["rate"] = _rate(messages, old_messages, dt)
        old_channels = {c.get("channel_name"): c for c in (old or {}).get("channels") or []}
        for c in t.get("channels") or []:
            cname = str(c.get("channel_name"))
            if channel is not None and cname != channel:
                continue
            part["channels"][cname] = _channel(
                c, old_channels.get(cname), dt, partition is not None
            )
    rows = [_topic_totals(t) for t in topics.values()]
    if channel is not None:
        rows = [t for t in rows if t["channels"]]  # only the topics that have it
    return Snapshot(node_rows, rows, dt)


def _topic_totals(topic: dict[str, Any]) -> dict[str, Any]:
    parts = list(topic.pop("parts").values())
    channels: dict[str, dict[str, Any]] = {}
    for part in parts:
        keys = ("depth", "memory_depth", "disk_depth", "bytes", "messages")
        _add(topic, {k: part.get(k, 0) for k in keys})
        if part.get("rate") is not None:
            topic["rate"] = (topic["rate"] or 0) + part["rate"]
        for cname, row in part["channels"].items():
            total = channels.setdefault(cname, {"channel": cname})
            _add(total, row)
    partitioned = any(p["partition"] is not None for p in parts)
    for part in parts:
        if partitioned:
            for cname, row in part["channels"].items():
                channels[cname].setdefault("lag_by_partition", {})[part["partition"]] = row["lag"]
        part["channels"] = [{"channel": k, **v} for k, v in part["channels"].items()]
    topic["partitioned"] = partitioned
    topic["partitions" if partitioned else "nodes"] = parts
    topic["channels"] = list(channels.values())
    return topic
