"""One model of a topic's layout, whichever lookupd answered.

Classic nsqlookupd (1.x flat, 0.x wrapped in ``{"status_code", "data"}``) lists producers;
Youzan's fork adds ``partitions`` (string keys) and optional ``meta``. Both parse into a
:class:`TopicLayout`.

A bad entry (a producer without a usable address or port, a partition key that is not a
number) is skipped and reported, and the rest of the answer is kept: one broken registration
must not hide every good nsqd. Only an answer that is not an object, or whose ``producers``
or ``partitions`` have the wrong type, is unusable as a whole.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

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


class Skipped(NamedTuple):
    """One entry left out of an answer: what is wrong (a fixed text, fit for de-duplicating
    log lines) and the entry itself, shortened."""

    problem: str
    entry: str


class _BadEntry(Exception):
    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


_DIGITS = re.compile(r"[0-9]{1,12}")

# Producers, or partitions, one answer may list. A real topic has tens of nsqd, rarely
# hundreds; a lookupd listing 10^5 would have a consumer dial them all (and decoding such an
# answer takes 40 MB and seconds), so the answer is refused as a whole.
MAX_NODES = 4096


def _parse_int(text: str) -> int | float:
    # json.loads refuses integers over 4300 digits with ValueError, failing the whole answer;
    # an absurd number only makes its own entry bad (inf is out of every range).
    return int(text) if len(text) <= 30 else float("inf")


def loads(body: bytes) -> Any:
    """Decode a lookupd's JSON body. Raises ValueError (or RecursionError on deep nesting)."""
    return json.loads(body, parse_int=_parse_int)


def _int(value: Any) -> int | None:
    """A whole number from JSON (int, integral float or digit string), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None  # is_integer() is False for inf, nan
    if isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        return int(value)
    return None


_NAME = re.compile(r"[A-Za-z0-9_.-]{1,253}")


def valid_host(host: str) -> bool:
    """A host name or IPv4 address (letters, digits, ``_.-``), or an IPv6 address (without
    brackets, with an optional ``%zone``): what a configured lookupd address may hold, and
    what an address from a lookupd's answer must hold before it is put in a URL or dialled."""
    if _NAME.fullmatch(host):
        return True
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return True


def port(value: Any) -> int | None:
    """A TCP port (1-65535) from JSON, else None."""
    n = _int(value)
    return n if n is not None and 0 < n < 65536 else None


def _node(raw: Any) -> Node:
    if not isinstance(raw, dict):
        raise _BadEntry("entry is not an object")
    host = raw.get("broadcast_address") or raw.get("address") or raw.get("hostname")
    if not isinstance(host, str) or not host.strip():
        raise _BadEntry("entry without an address")
    if not valid_host(host.strip()):
        raise _BadEntry("entry with an invalid address (not a host name, IPv4 or IPv6 address)")
    tcp = port(raw.get("tcp_port"))
    if tcp is None:
        raise _BadEntry("entry without a valid tcp_port (1-65535)")
    # http_port is informative only: a bad one does not make the node unreachable.
    http = port(raw.get("http_port")) or 0
    return Node(host.strip(), tcp, http, str(raw.get("version", ""))[:100])


def _skip(skipped: list[Skipped] | None, problem: str, entry: Any) -> None:
    if skipped is not None:
        skipped.append(Skipped(problem, f"{entry!r:.200}"))


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.lower() == "true"
    return bool(value)


def _meta(raw: dict[Any, Any], partitions: int) -> TopicMeta:
    partition_num = _int(raw.get("partition_num", partitions))
    replica = _int(raw.get("replica", 1))
    if partition_num is None or partition_num < 0 or replica is None or replica < 0:
        raise _BadEntry("meta without valid partition_num and replica")
    return TopicMeta(
        partition_num=partition_num,
        replica=replica,
        ordered=_bool(raw.get("ordered", False)),
        extend_support=_bool(raw.get("extend_support", False)),
    )


def too_many_nodes(body: bytes) -> bool:
    """Whether an answer surely holds more than :data:`MAX_NODES` entries, told before it is
    decoded at all (decoding holds the event loop: 4 MB of small objects take 40 MB and a
    good part of a second). Each entry is a JSON object, with at most a dozen fields."""
    return body.count(b"{") > 2 * MAX_NODES + 16 or body.count(b",") > 16 * MAX_NODES


def _producers(body: Any) -> tuple[dict[Any, Any], list[Any]]:
    """The answer's object and its ``producers`` list; ProtocolError if either is unusable."""
    data = unwrap(body)
    if not isinstance(data, dict):
        raise ProtocolError(f"lookupd answer is not a JSON object: {data!r:.100}")
    producers = data.get("producers")
    if producers is None:
        producers = []
    if not isinstance(producers, list):
        raise ProtocolError("lookupd answer has a non-list 'producers'")
    return data, producers


def parse_lookup(body: Any, skipped: list[Skipped] | None = None) -> TopicLayout:
    """Parse a ``/lookup`` answer (already JSON-decoded).

    Bad producer or partition entries and a malformed ``meta`` are left out and, when
    ``skipped`` is given, appended to it. Raises :class:`ProtocolError` only when the answer
    as a whole is unusable.
    """
    data, producers = _producers(body)
    raw_parts = data.get("partitions")
    if raw_parts is None:
        raw_parts = {}
    if not isinstance(raw_parts, dict):
        raise ProtocolError("lookupd answer has a non-object 'partitions'")
    if max(len(producers), len(raw_parts)) > MAX_NODES:
        raise ProtocolError(f"lookupd answer lists more than {MAX_NODES} nsqd")
    nodes: dict[Node, None] = {}
    for raw in producers:
        try:
            nodes[_node(raw)] = None
        except _BadEntry as exc:
            _skip(skipped, f"producer {exc.problem}", raw)
    partitions: dict[int, Node] = {}
    for key, value in raw_parts.items():
        if not _DIGITS.fullmatch(key):  # JSON object keys are strings
            _skip(skipped, "partition key that is not a non-negative number", key)
            continue
        try:
            partitions[int(key)] = _node(value)
        except _BadEntry as exc:
            _skip(skipped, f"partition {exc.problem}", value)
    meta = None
    raw_meta = data.get("meta")
    if isinstance(raw_meta, dict):
        try:
            meta = _meta(raw_meta, len(partitions))
        except _BadEntry as exc:
            _skip(skipped, exc.problem, raw_meta)
    return TopicLayout(tuple(nodes), partitions, meta)


def parse_nodes(body: Any, skipped: list[Skipped] | None = None) -> dict[str, tuple[Node, ...]]:
    """Parse a classic ``/nodes`` answer: for each topic, the nsqd that carry it untombstoned.

    That is what ``/lookup`` would list for each topic (both leave out inactive nsqd, and
    ``/lookup`` leaves out tombstoned ones): one request answers for every topic. Bad entries
    are skipped as in :func:`parse_lookup`.
    """
    _, producers = _producers(body)
    if len(producers) > MAX_NODES:
        raise ProtocolError(f"lookupd answer lists more than {MAX_NODES} nsqd")
    found: dict[str, dict[Node, None]] = {}
    for raw in producers:
        try:
            node = _node(raw)
        except _BadEntry as exc:
            _skip(skipped, f"producer {exc.problem}", raw)
            continue
        topics, tombstones = raw.get("topics"), raw.get("tombstones")
        if not isinstance(topics, list):
            _skip(skipped, "producer without a list of topics", raw)
            continue
        if not isinstance(tombstones, list) or len(tombstones) != len(topics):
            tombstones = [False] * len(topics)  # older lookupds send none: nothing tombstoned
        for topic, tombstoned in zip(topics, tombstones, strict=True):
            if isinstance(topic, str) and tombstoned is not True:
                found.setdefault(topic, {})[node] = None
    return {topic: tuple(nodes) for topic, nodes in found.items()}


def parse_nsqds(body: Any, skipped: list[Skipped] | None = None) -> tuple[Node, ...]:
    """Parse a classic ``/nodes`` answer into every nsqd it lists, whatever its topics: where
    a topic that does not exist yet can be created (nsqd creates it on its first PUB)."""
    _, producers = _producers(body)
    if len(producers) > MAX_NODES:
        raise ProtocolError(f"lookupd answer lists more than {MAX_NODES} nsqd")
    found: dict[Node, None] = {}
    for raw in producers:
        try:
            found[_node(raw)] = None
        except _BadEntry as exc:
            _skip(skipped, f"producer {exc.problem}", raw)
    return tuple(found)


def parse_listlookup(
    body: Any, skipped: list[Skipped] | None = None
) -> tuple[list[str], str | None]:
    """Parse a Youzan ``/listlookup`` answer into (lookupd base URLs, leader's URL or None).

    Entries without a usable address or HTTP port are left out (and appended to ``skipped``).
    An answer of another shape (a classic lookupd's, say) lists nothing.
    """
    data = unwrap(body)
    if not isinstance(data, dict):
        return [], None
    nodes = data.get("lookupdnodes")
    urls: dict[str, None] = {}
    for raw in nodes if isinstance(nodes, list) else []:
        try:
            urls[_lookupd_url(raw)] = None
        except _BadEntry as exc:
            _skip(skipped, f"lookupd node {exc.problem}", raw)
    try:
        leader: str | None = _lookupd_url(data.get("lookupdleader"))
    except _BadEntry:
        leader = None  # a cluster without a leader right now sends an empty entry
    return list(urls), leader


def _lookupd_url(raw: Any) -> str:
    if not isinstance(raw, dict):
        raise _BadEntry("entry is not an object")
    ip = raw.get("NodeIP")
    if not isinstance(ip, str) or not valid_host(ip):
        raise _BadEntry("entry without a valid NodeIP")
    http = port(raw.get("HttpPort"))
    if http is None:
        raise _BadEntry("entry without a valid HttpPort (1-65535)")
    return f"http://[{ip}]:{http}" if ":" in ip else f"http://{ip}:{http}"
