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
    params = {"topic": topic, "partition_num": str(partitions), "replicator": str(replicas)}
    if ordered:
        params["orderedmulti"] = "true"
    if ext:
        params["extend"] = "true"
    if multipart:  # an unordered topic with more partitions than nsqd nodes needs it
        params["multipart"] = "true"
    url = f"http://{leader}/topic/create?{urllib.parse.urlencode(params)}"

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
        node = info["partitions"][str(p)]
        q = urllib.parse.urlencode({"topic": topic, "partition": str(p), "channel": channel})
        ch_url = f"http://{node['broadcast_address']}:{node['http_port']}/channel/create?{q}"

        def create_channel(ch_url: str = ch_url) -> bool:
            status, body = http_request(ch_url, method="POST", timeout=10.0)
            if status != 200:
                retrigger()
                raise ClusterError(f"POST {ch_url} -> HTTP {status}: {body[:300]!r}")
            return True

        poll(f"channel {channel} on {topic}:{p}", create_channel, timeout)

    def writable() -> dict[str, Any] | None:
        w = lookup(leader, topic, "w")
        parts = w.get("partitions") or {}
        if all(str(p) in parts for p in range(partitions)):
            return w
        retrigger()
        return None

    return poll(f"all {partitions} partitions of {topic} writable", writable, timeout)
