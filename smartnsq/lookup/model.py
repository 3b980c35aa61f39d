"""One model of a topic's layout, whichever lookupd answered.

Classic nsqlookupd (1.x flat, 0.x wrapped in ``{"status_code", "data"}``) lists producers;
Youzan's fork adds ``partitions`` (string keys) and optional ``meta``. Both parse into a
:class:`TopicLayout`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from smartnsq.errors import ProtocolError


@dataclass(frozen=True, slots=True)
class Node:
    """One nsqd as lookupd describes it."""

    broadcast_address: str
    tcp_port: int
    http_port: int = 0
    version: str = ""

    @property
    def tcp_address(self) -> str:
        host = self.broadcast_address
        return f"[{host}]:{self.tcp_port}" if ":" in host else f"{host}:{self.tcp_port}"


@dataclass(frozen=True, slots=True)
class TopicMeta:
    """Youzan topic metadata (``meta`` in lookup answers)."""

    partition_num: int
    replica: int = 1
    ordered: bool = False
    extend_support: bool = False


@dataclass(frozen=True, slots=True)
class TopicLayout:
    """Where a topic lives. ``partitions`` is empty for classic clusters."""

    producers: tuple[Node, ...] = ()
    partitions: Mapping[int, Node] = field(default_factory=dict)
    meta: TopicMeta | None = None

    @property
    def partitioned(self) -> bool:
        return bool(self.partitions) or self.meta is not None


def unwrap(body: Any) -> Any:
    """Strip the legacy ``{"status_code", "status_txt", "data"}`` envelope if present."""
    if isinstance(body, dict) and "status_code" in body and "data" in body:
        return body["data"]
    return body


def _node(raw: Any) -> Node:
    if not isinstance(raw, dict):
        raise ProtocolError(f"lookupd producer entry is not an object: {raw!r:.100}")
    host = raw.get("broadcast_address") or raw.get("address") or raw.get("hostname")
    try:
        tcp = int(raw["tcp_port"])
        http = int(raw.get("http_port") or 0)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(
            f"lookupd producer entry without a valid tcp_port: {raw!r:.200}"
        ) from exc
    if not isinstance(host, str) or not host:
        raise ProtocolError(f"lookupd producer entry without an address: {raw!r:.200}")
    return Node(host, tcp, http, str(raw.get("version", "")))


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.lower() == "true"
    return bool(value)


def parse_lookup(body: Any) -> TopicLayout:
    """Parse a ``/lookup`` answer (already JSON-decoded). Raises :class:`ProtocolError`."""
    data = unwrap(body)
    if not isinstance(data, dict):
        raise ProtocolError(f"lookupd answer is not a JSON object: {data!r:.100}")
    producers = data.get("producers")
    if producers is None:
        producers = []
    if not isinstance(producers, list):
        raise ProtocolError("lookupd answer has a non-list 'producers'")
    nodes = tuple(dict.fromkeys(_node(p) for p in producers))
    partitions: dict[int, Node] = {}
    raw_parts = data.get("partitions")
    if raw_parts is None:
        raw_parts = {}
    if not isinstance(raw_parts, dict):
        raise ProtocolError("lookupd answer has a non-object 'partitions'")
    for key, value in raw_parts.items():
        try:
            partitions[int(key)] = _node(value)
        except ValueError as exc:
            raise ProtocolError(f"lookupd partition key {key!r} is not a number") from exc
    meta = None
    raw_meta = data.get("meta")
    if isinstance(raw_meta, dict):
        try:
            meta = TopicMeta(
                partition_num=int(raw_meta.get("partition_num", len(partitions))),
                replica=int(raw_meta.get("replica", 1)),
                ordered=_bool(raw_meta.get("ordered", False)),
                extend_support=_bool(raw_meta.get("extend_support", False)),
            )
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"lookupd meta is malformed: {raw_meta!r:.200}") from exc
    return TopicLayout(nodes, partitions, meta)
