"""Classic reads must not read nothing in silence: the nsqd they consume from must be there.

A Consumer retries an nsqd it cannot reach, for ever, as it should; a Spark read that waits
``idleTimeoutMs`` for a first message would then return no rows, as if the channel were
empty. So while the query is planned, the driver asks lookupd (if given) and opens a TCP
connection to each nsqd the read would use; if none answers, the query fails here. One
unreachable nsqd among reachable ones is only logged: the others are read.

This module does not import pyspark.
"""

from __future__ import annotations

import logging
import socket
from concurrent.futures import ThreadPoolExecutor

from smartnsq.errors import LookupFailed, NoNsqdAvailable, NSQError
from smartnsq.lookup.model import TopicLayout
from smartnsq.net.connection import parse_address
from smartnsq.notice import warn_unheard
from smartnsq.spark import youzan
from smartnsq.spark.options import Settings

log = logging.getLogger("smartnsq.spark")

DEFAULT_CONNECT_TIMEOUT = 5.0  # as the Consumer's connect_timeout


def lookup(settings: Settings) -> TopicLayout | None:
    """The topic as lookupd sees it (None: it does not know it); fails if no lookupd answers."""
    assert settings.topic is not None
    try:
        return youzan.topic_layout(settings.lookupd, settings.topic)
    except LookupFailed as exc:
        raise LookupFailed(
            f"option 'lookupd': {exc}; check the addresses (nsqlookupd's HTTP port, 4161 "
            "by default)"
        ) from None


def check_classic(settings: Settings, layout: TopicLayout | None) -> None:
    """Fail (:class:`~smartnsq.errors.NoNsqdAvailable`) when no nsqd of the read answers.

    ``layout`` is what lookupd said of the topic (None: nothing, or no option 'lookupd')."""
    assert settings.topic is not None
    listed = [node.tcp_address for node in layout.producers] if layout is not None else []
    addresses = list(dict.fromkeys([*settings.nsqd, *listed]))
    if not addresses:  # only lookupd, which does not know the topic: nothing to read yet
        text = (
            f"no lookupd lists an nsqd for topic {settings.topic!r} (TOPIC_NOT_FOUND: it does "
            "not exist yet, or no nsqd has it): the read finds no messages"
        )
        log.warning("%s", text)
        warn_unheard(log, ("spark-topic-missing", settings.topic), text)
        return
    timeout = float(dict(settings.client).get("connect_timeout") or DEFAULT_CONNECT_TIMEOUT)
    with ThreadPoolExecutor(min(len(addresses), 16)) as pool:
        results = list(pool.map(lambda a: _probe(a, timeout), addresses))
    failed = [(a, why) for a, why in zip(addresses, results, strict=True) if why is not None]
    if len(failed) == len(addresses):
        given = "option 'nsqd'" if settings.nsqd else "the nsqd that lookupd lists"
        raise NoNsqdAvailable(
            f"no nsqd of topic {settings.topic!r} can be reached from the Spark driver: "
            f"{_listed(failed)}; check {given} (nsqd's TCP port, 4150 by default)"
        )
    if failed:
        log.warning("nsqd not reachable, the read goes on without it: %s", _listed(failed))


def _listed(failed: list[tuple[str, str]]) -> str:
    return ", ".join(f"{address} ({why})" for address, why in failed)


def _probe(address: str, timeout: float) -> str | None:
    """None if ``address`` accepts a TCP connection, else why not."""
    try:
        host, port = parse_address(address)
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except OSError as exc:
        return exc.strerror or str(exc)
    except NSQError as exc:  # an address lookupd listed that is not host:port
        return str(exc)
