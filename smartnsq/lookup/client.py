"""Querying nsqlookupd over HTTP."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import httpx

from smartnsq.errors import InvalidArgument, LookupFailed, ProtocolError, TopicNotFound
from smartnsq.lookup.model import TopicLayout, parse_lookup

log = logging.getLogger("smartnsq.lookup")

ACCEPT = {"Accept": "application/vnd.nsq; version=1.0"}


def normalize_lookupd_address(address: str) -> str:
    """``host:port`` or ``http(s)://host:port[/]`` -> base URL without trailing slash."""
    if not isinstance(address, str) or not address.strip():
        raise InvalidArgument(f"lookupd address must be 'host:port' or a URL, not {address!r}")
    address = address.strip().rstrip("/")
    url = address if "://" in address else f"http://{address}"
    try:
        parsed = httpx.URL(url)
    except Exception as exc:  # httpx raises several types for bad URLs
        raise InvalidArgument(f"lookupd address {address!r} is not a valid URL") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host or parsed.port is None:
        raise InvalidArgument(f"lookupd address {address!r} must look like host:port")
    return url


def check_lookupd_addresses(addresses: Sequence[str] | str) -> list[str]:
    if isinstance(addresses, str):
        addresses = [addresses]
    return list(dict.fromkeys(normalize_lookupd_address(a) for a in addresses))


async def fetch_lookup(
    client: httpx.AsyncClient, base_url: str, topic: str, *, access: str | None = None
) -> TopicLayout:
    """``GET /lookup?topic=T`` on one lookupd.

    A 404 means the topic does not exist there: :class:`TopicNotFound`. Network errors,
    other statuses and malformed answers raise :class:`LookupFailed`.
    """
    params = {"topic": topic}
    if access is not None:
        params["access"] = access
        params["metainfo"] = "true"
    try:
        resp = await client.get(f"{base_url}/lookup", params=params, headers=ACCEPT)
    except httpx.HTTPError as exc:
        raise LookupFailed(f"lookupd {base_url} unreachable: {exc!r}") from exc
    if resp.status_code == 404:
        raise TopicNotFound(f"lookupd {base_url} does not know topic {topic!r}")
    if resp.status_code == 500 and b"TOPIC_NOT_FOUND" in resp.content:  # 0.x envelope style
        raise TopicNotFound(f"lookupd {base_url} does not know topic {topic!r}")
    if resp.status_code != 200:
        raise LookupFailed(f"lookupd {base_url} answered HTTP {resp.status_code}")
    try:
        return parse_lookup(resp.json())
    except (ValueError, ProtocolError) as exc:
        raise LookupFailed(f"lookupd {base_url} sent an unusable answer: {exc}") from exc
