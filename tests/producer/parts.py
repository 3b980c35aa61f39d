"""The producer's parts built on their own, with the front door's defaults."""

from __future__ import annotations

import inspect
import time
from typing import Any

from smartnsq import Producer
from smartnsq.producer.nodes import Node, Nodes
from smartnsq.producer.plan import Plan
from smartnsq.producer.settings import Settings


def settings(*addresses: str, **given: Any) -> Settings:
    """The settings of ``Producer(addresses or one nsqd, **given)``."""
    args = {n: p.default for n, p in inspect.signature(Producer).parameters.items()}
    args["nsqd_tcp_addresses"] = list(addresses) or ["127.0.0.1:4150"]
    return Settings(**(args | given))


def plan(**given: Any) -> Plan:
    return Plan(settings(**given))


def nodes(*addresses: str, **given: Any) -> Nodes[Node[Any, None]]:
    """Nodes on the blocking producer's clock, with fake connections' nodes."""
    return Nodes(settings(*addresses, **given), lambda a: Node(a, None), time.monotonic)
