"""Topic administration helpers for the Youzan HA fork (stdlib only)."""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable
from typing import Any, TypeVar

from compat.cluster import Cluster, ClusterError, http_json, http_request

T = TypeVar("T")


def _lookupd_list(target: Cluster | str | list[str]) -> list[str]:
    if isinstance(target, Cluster):
        return [d.http for d in target.lookupd]
    if isinstance(target, str):
        return [target]
    return list(target)


def find_leader(target: Cluster | str | list[str], timeout: float = 30.0) -> str:
    """``host:port`` (HTTP) of the leader nsqlookupd, from ``/listlookup`` of any given lookupd."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        for http in _lookupd_list(target):
            try:
                info = http_json(f"http://{http}/listlookup", timeout=2.0) or {}
            except (OSError, ValueError, ClusterError) as e:
                last = e
                continue
            leader = info.get("lookupdleader") or {}
            if leader.get("ID"):
                return f"{leader['NodeIP']}:{leader['HttpPort']}"
        if time.monotonic() >= deadline:
            raise ClusterError(f"no nsqlookupd leader found within {timeout}s (last error: {last})")
        time.sleep(0.1)


def lookup(lookupd_http: str, topic: str, access: str = "r") -> dict[str, Any]:
    """``/lookup?topic=…&access=…&metainfo=true`` (flat payload); raises ClusterError on non-200."""
    q = urllib.parse.urlencode({"topic": topic, "access": access, "metainfo": "true"})
    return http_json(f"http://{lookupd_http}/lookup?{q}", timeout=5.0) or {}


def poll(what: str, check: Callable[[], T | None], timeout: float = 60.0) -> T:
    """Call ``check`` until it returns something truthy; ClusterError after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            result = check()
            if result:
                return result
            last = "not yet"
        except (OSError, ValueError, ClusterError) as e:
            last = e
        if time.monotonic() >= deadline:
            raise ClusterError(f"timed out after {timeout}s waiting for {what} (last: {last})")
        time.sleep(0.1)


def create_topic(
    cluster_or_lookupd_http: Cluster | str | list[str],
    topic: str,
    partitions: int = 2,
    replicas: int = 1,
    ordered: bool = False,
    ext: bool = False,
    channel: str | None = "ch",
    timeout: float = 60.0,
    multipart: bool = False,
) -> dict[str, Any]:
    """Create ``topic`` on the leader lookupd, create ``channel`` on every partition leader,
    and wait until every partition is writable. Returns the final ``access=w`` lookup payload.

    With ``channel=None`` no channel is created and only readable partitions are awaited
    (the fork does not make a topic writable before it has a channel).
    """
    leader = find_leader(cluster_or_lookupd_http, timeout=timeout)
    url = _create_url(leader, topic, partitions, replicas, ordered, ext, multipart)

    def create() -> bool:
        status, body = http_request(url, method="POST", timeout=10.0)
        if status != 200:
            raise ClusterError(f"POST {url} -> HTTP {status}: {body[:300]!r}")
        return True

    # creation can fail transiently right after start-up (nsqd not yet known to the coordinator)
    poll(f"topic {topic} creation", create, timeout)

    def readable() -> dict[str, Any] | None:
        info = lookup(leader, topic, "r")
        parts = info.get("partitions") or {}
        return info if all(str(p) in parts for p in range(partitions)) else None

    info: dict[str, Any] = poll(
        f"all {partitions} partitions of {topic} in read lookup", readable, timeout
    )
    if channel is None:
        return info
    # The fork only hands the new partitions to their leaders (write enabled, leader session
    # known) in the lookupd's topic check, which runs at most every 6 s after a full check
    # (else every 60 s).  Re-posting the idempotent create re-triggers that check.
    last_trigger = [time.monotonic()]

    def retrigger() -> None:
        if time.monotonic() - last_trigger[0] >= 2.0:
            last_trigger[0] = time.monotonic()
            http_request(url, method="POST", timeout=10.0)

    for p in range(partitions):
        _create_channel(info["partitions"][str(p)], topic, p, channel, ordered, retrigger, timeout)

    def writable() -> dict[str, Any] | None:
        w = lookup(leader, topic, "w")
        parts = w.get("partitions") or {}
        if all(str(p) in parts for p in range(partitions)):
            return w
        retrigger()
        return None

    return poll(f"all {partitions} partitions of {topic} writable", writable, timeout)


def _create_url(
    leader: str,
    topic: str,
    partitions: int,
    replicas: int,
    ordered: bool,
    ext: bool,
    multipart: bool,
) -> str:
    params = {"topic": topic, "partition_num": str(partitions), "replicator": str(replicas)}
    if ordered:
        params["orderedmulti"] = "true"
    if ext:
        params["extend"] = "true"
    if multipart:  # an unordered topic with more partitions than nsqd nodes needs it
        params["multipart"] = "true"
    return f"http://{leader}/topic/create?{urllib.parse.urlencode(params)}"


def _create_channel(
    node: dict[str, Any],
    topic: str,
    partition: int,
    channel: str,
    ordered: bool,
    retrigger: Callable[[], None],
    timeout: float,
) -> None:
    """Create ``channel`` on the partition's leader; for an ordered topic also set its order.

    A channel of an ordered topic turns ordered on its first ``SUB_ORDERED``, and the fork
    then resets its read position: the first waiting message is delivered twice. Setting the
    order before anything is published avoids that.
    """
    base = f"http://{node['broadcast_address']}:{node['http_port']}"
    q = {"topic": topic, "partition": str(partition), "channel": channel}
    urls = [f"{base}/channel/create?{urllib.parse.urlencode(q)}"]
    if ordered:
        urls.append(f"{base}/channel/setorder?{urllib.parse.urlencode({**q, 'order': 'true'})}")
    for url in urls:

        def post(url: str = url) -> bool:
            status, body = http_request(url, method="POST", timeout=10.0)
            if status != 200:
                retrigger()
                raise ClusterError(f"POST {url} -> HTTP {status}: {body[:300]!r}")
            return True

        path = url.split("?")[0].split("/", 3)[-1]
        poll(f"{path} of {channel} on {topic}:{partition}", post, timeout)


def expand_topic(
    cluster_or_lookupd_http: Cluster | str | list[str],
    topic: str,
    partitions: int,
    channel: str | None = None,
    timeout: float = 60.0,
) -> dict[str, Any]:
    """Raise ``topic``'s partition count to ``partitions`` (``/topic/partition/expand`` on the
    leader lookupd) and wait until every partition is in the read lookup; with ``channel``,
    create it on the new partitions and wait until all are writable. Returns the last lookup.

    The lookupd refuses to expand while it thinks the cluster unstable, which after a topic
    creation lasts until its next full topic check (up to 60 s); re-posting the topic's
    (idempotent) create makes that check run within a few seconds.
    """
    leader = find_leader(cluster_or_lookupd_http, timeout=timeout)
    meta = lookup(leader, topic, "r").get("meta") or {}
    old = int(meta.get("partition_num") or 0)
    if not 0 < old <= partitions:
        raise ClusterError(f"cannot expand {topic} from {old} to {partitions} partitions")
    ordered = bool(meta.get("ordered"))

    def create_url(partition_num: int) -> str:  # the topic's own create, re-posted
        return _create_url(
            leader,
            topic,
            partition_num,
            int(meta.get("replica") or 1),
            ordered,
            bool(meta.get("extend_support")),
            bool(meta.get("multi_part")),
        )

    create = create_url(old)
    q = urllib.parse.urlencode({"topic": topic, "partition_num": str(partitions)})
    url = f"http://{leader}/topic/partition/expand?{q}"
    last_trigger = [time.monotonic()]

    def retrigger(url: str = create) -> None:
        if time.monotonic() - last_trigger[0] >= 2.0:
            last_trigger[0] = time.monotonic()
            http_request(url, method="POST", timeout=10.0)

    def expand() -> bool:
        status, body = http_request(url, method="POST", timeout=10.0)
        if status != 200:
            retrigger()
            raise ClusterError(f"POST {url} -> HTTP {status}: {body[:300]!r}")
        return True

    poll(f"expansion of {topic} to {partitions} partitions", expand, timeout)
    create = create_url(partitions)

    def readable() -> dict[str, Any] | None:
        info = lookup(leader, topic, "r")
        parts = info.get("partitions") or {}
        if all(str(p) in parts for p in range(partitions)):
            return info
        retrigger(create)
        return None

    info: dict[str, Any] = poll(f"{partitions} partitions of {topic} readable", readable, timeout)
    if channel is None:
        # No channel: a consumer's SUB creates it; that needs the new leaders in place.
        for p in range(old, partitions):
            node = info["partitions"][str(p)]
            stats = f"http://{node['broadcast_address']}:{node['http_port']}/stats?" + (
                urllib.parse.urlencode({"format": "json", "topic": topic})
            )

            def leads(stats: str = stats, p: int = p) -> bool:
                retrigger(create)
                topics = (http_json(stats, timeout=5.0) or {}).get("topics") or []
                return any(
                    str(t.get("topic_partition")) == str(p) and t.get("is_leader") for t in topics
                )

            poll(f"a leader for {topic}:{p}", leads, timeout)
        return info
    for p in range(old, partitions):
        node = info["partitions"][str(p)]
        _create_channel(node, topic, p, channel, ordered, lambda: retrigger(create), timeout)

    def writable() -> dict[str, Any] | None:
        w = lookup(leader, topic, "w")
        if all(str(p) in (w.get("partitions") or {}) for p in range(partitions)):
            return w
        retrigger(create)
        return None

    return poll(f"{partitions} partitions of {topic} writable", writable, timeout)


def node_id(cluster: Cluster, i: int) -> str:
    """The coordinator's id of nsqd ``i`` (``ip:rpc_port:tcp_port:worker_id``), as the
    lookupd admin endpoints name nodes."""
    d = cluster.nsqd[i]
    rpc = next(a.split("=", 1)[1] for a in d.argv if a.startswith("--rpc-port="))
    worker = next(a.split("=", 1)[1] for a in d.argv if a.startswith("--worker-id="))
    host, tcp = d.tcp.rsplit(":", 1)
    if "--broadcast-interface=lo" in d.argv:  # it registers 127.0.0.1 wherever it listens
        host = "127.0.0.1"
    return f"{host}:{rpc}:{tcp}:{worker}"


def move_leader(
    cluster: Cluster, topic: str, partition: int, to: int, timeout: float = 60.0
) -> None:
    """Move the leadership of a replicated partition to nsqd ``to`` (which must hold a
    replica) with the leader lookupd's ``/topic/partition/move``, and wait until the read
    lookup names it. Like an expansion, the move is refused while the lookupd thinks the
    cluster unstable; re-posting the topic's create brings its check forward."""
    leader = find_leader(cluster, timeout=timeout)
    info = lookup(leader, topic, "r")
    meta = info.get("meta") or {}
    current = str(info["partitions"][str(partition)]["distributed_id"])
    target = node_id(cluster, to)
    if current == target:
        raise ClusterError(f"nsqd {to} already leads {topic}:{partition}")
    create = _create_url(
        leader,
        topic,
        int(meta.get("partition_num") or 1),
        int(meta.get("replica") or 1),
        bool(meta.get("ordered")),
        bool(meta.get("extend_support")),
        bool(meta.get("multi_part")),
    )
    q = {"topic": topic, "partition": str(partition), "move_leader": "true"}
    url = f"http://{leader}/topic/partition/move?" + urllib.parse.urlencode(
        {**q, "move_from": current, "move_to": target}
    )

    def move() -> bool:
        status, body = http_request(url, method="POST", timeout=30.0)
        if status != 200:
            http_request(create, method="POST", timeout=10.0)
            raise ClusterError(f"POST {url} -> HTTP {status}: {body[:300]!r}")
        return True

    poll(f"leader of {topic}:{partition} moved to nsqd {to}", move, timeout)

    def moved() -> bool:
        parts = lookup(leader, topic, "r").get("partitions") or {}
        return str((parts.get(str(partition)) or {}).get("distributed_id")) == target

    poll(f"lookup naming nsqd {to} leader of {topic}:{partition}", moved, timeout)


def restore_writable(
    cluster_or_lookupd_http: Cluster | str | list[str],
    topic: str,
    channel: str = "ch",
    timeout: float = 120.0,
) -> dict[str, Any]:
    """After a partition's leader was lost, do what an operator does until every partition
    is writable again: create ``channel`` (and its order) on each partition's new leader and
    re-post the topic's create, which brings the leader lookupd's topic check forward.

    The fork makes a partition with a new leader writable only once that leader has a
    channel and a topic check has run; on its own that took about 110 s here (and never,
    within 120 s, while the new leader had no channel). Returns the last ``access=w`` lookup.
    """
    leader = find_leader(cluster_or_lookupd_http, timeout=timeout)
    meta = lookup(leader, topic, "r").get("meta") or {}
    partitions = int(meta.get("partition_num") or 0)
    create = _create_url(
        leader,
        topic,
        partitions,
        int(meta.get("replica") or 1),
        bool(meta.get("ordered")),
        bool(meta.get("extend_support")),
        bool(meta.get("multi_part")),
    )
    last_trigger = [-float("inf")]

    def retrigger() -> None:
        if time.monotonic() - last_trigger[0] >= 2.0:
            last_trigger[0] = time.monotonic()
            http_request(create, method="POST", timeout=10.0)

    def writable() -> dict[str, Any] | None:
        w = lookup(leader, topic, "w")
        if all(str(p) in (w.get("partitions") or {}) for p in range(partitions)):
            return w
        readable = lookup(leader, topic, "r").get("partitions") or {}
        for p, node in readable.items():
            if p not in (w.get("partitions") or {}):
                base = f"http://{node['broadcast_address']}:{node['http_port']}"
                q = {"topic": topic, "partition": str(p), "channel": channel}
                http_request(f"{base}/channel/create?{urllib.parse.urlencode(q)}", "POST")
                if meta.get("ordered"):
                    q["order"] = "true"
                    http_request(f"{base}/channel/setorder?{urllib.parse.urlencode(q)}", "POST")
        retrigger()
        return None

    return poll(f"every partition of {topic} writable again", writable, timeout)
