"""Querying nsqlookupd over HTTP."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import anyio

from smartnsq.errors import InvalidArgument, LookupFailed, ProtocolError, TopicNotFound
from smartnsq.lookup.model import (
    MAX_NODES,
    Node,
    Skipped,
    TopicLayout,
    loads,
    parse_listlookup,
    parse_lookup,
    parse_nodes,
    parse_nsqds,
    too_many_nodes,
    valid_host,
)
from smartnsq.net.http import HttpClient, HttpError, TooLarge

# identity: the size cap counts the bytes we keep, not a compressed stream that may inflate.
ACCEPT = {"Accept": "application/vnd.nsq; version=1.0", "Accept-Encoding": "identity"}

MAX_RESPONSE_SIZE = 4 << 20


class NoListLookup(LookupFailed):
    """The lookupd answers 404 to ``/listlookup``: a classic lookupd, not worth asking again."""


class NoNodes(LookupFailed):
    """The lookupd refuses ``/nodes`` (404, 403 or 405): its topics must be looked up one by one."""


def normalize_lookupd_address(address: str) -> str:
    """``host:port`` or ``http(s)://host:port[/]`` -> base URL without trailing slash."""
    if not isinstance(address, str) or not address.strip():
        raise InvalidArgument(f"lookupd address must be 'host:port' or a URL, not {address!r}")
    address = address.strip().rstrip("/")
    url = address if "://" in address else f"http://{address}"
    try:
        parsed = urlsplit(url)
        host, port = parsed.hostname, parsed.port
    except ValueError as exc:  # a port out of range or not a number, a broken [IPv6]
        raise InvalidArgument(f"lookupd address {address!r} is not a valid URL") from exc
    if parsed.scheme not in ("http", "https") or not host or port is None:
        raise InvalidArgument(f"lookupd address {address!r} must look like host:port")
    if parsed.path or parsed.query or parsed.fragment or "@" in parsed.netloc:
        raise InvalidArgument(f"lookupd address {address!r} must be host:port, with no path")
    if not valid_host(host):
        raise InvalidArgument(f"lookupd address {address!r} has an invalid host name")
    return url


def check_lookupd_addresses(addresses: Sequence[str] | str) -> list[str]:
    """Normalize one or several lookupd addresses, dropping duplicates."""
    if isinstance(addresses, str):
        addresses = [addresses]
    return list(dict.fromkeys(normalize_lookupd_address(a) for a in addresses))


async def fetch(
    client: HttpClient,
    base_url: str,
    path: str,
    params: Mapping[str, str] | None = None,
    *,
    timeout: float | None = None,
    max_response_size: int = MAX_RESPONSE_SIZE,
) -> tuple[int, bytes]:
    """``GET base_url + path``: the status and the whole body.

    ``timeout`` bounds the whole request, body included (a server sending a byte now and
    then must not hold it forever), and the body is read up to ``max_response_size`` bytes.
    Failures raise :class:`LookupFailed`.
    """
    with anyio.move_on_after(timeout):
        try:
            r = await client.get(f"{base_url}{path}", params, ACCEPT, max_size=max_response_size)
        except TooLarge:
            raise LookupFailed(
                f"lookupd {base_url} sent more than {max_response_size} bytes for "
                f"{path} (max_response_size); its answer is ignored"
            ) from None
        except HttpError as exc:
            raise LookupFailed(f"lookupd {base_url} failed: {exc}") from exc
        return r.status, r.body
    raise LookupFailed(f"lookupd {base_url} did not answer {path} within {timeout}s")


async def fetch_lookup(
    client: HttpClient,
    base_url: str,
    topic: str,
    *,
    access: str | None = None,
    timeout: float | None = None,
    max_response_size: int = MAX_RESPONSE_SIZE,
    skipped: list[Skipped] | None = None,
) -> TopicLayout:
    """``GET /lookup?topic=T`` on one lookupd.

    A 404 means the topic does not exist there: :class:`TopicNotFound`. Network errors, other
    statuses, answers late or too large (see :func:`fetch`) and unusable answers raise
    :class:`LookupFailed`. Bad entries are skipped and appended to ``skipped``.
    """
    params = {"topic": topic}
    if access is not None:
        params["access"] = access
        params["metainfo"] = "true"
    status, body = await fetch(
        client, base_url, "/lookup", params, timeout=timeout, max_response_size=max_response_size
    )
    if status == 404:
        raise TopicNotFound(f"lookupd {base_url} does not know topic {topic!r}")
    if status == 500 and b"TOPIC_NOT_FOUND" in body:  # 0.x envelope style
        raise TopicNotFound(f"lookupd {base_url} does not know topic {topic!r}")
    if status != 200:
        raise LookupFailed(f"lookupd {base_url} answered HTTP {status}{_redirect(status)}")
    if too_many_nodes(body):
        raise LookupFailed(
            f"lookupd {base_url} sent an unusable answer: it lists more than {MAX_NODES} nsqd"
        )
    try:
        return parse_lookup(loads(body), skipped)
    except (ValueError, RecursionError, ProtocolError) as exc:
        raise LookupFailed(f"lookupd {base_url} sent an unusable answer: {exc!s:.200}") from exc


async def fetch_nodes(
    client: HttpClient,
    base_url: str,
    *,
    timeout: float | None = None,
    max_response_size: int = MAX_RESPONSE_SIZE,
    skipped: list[Skipped] | None = None,
) -> dict[str, tuple[Node, ...]]:
    """``GET /nodes`` on one classic lookupd: every topic's nsqd (see
    :func:`~smartnsq.lookup.model.parse_nodes`). Failures raise :class:`LookupFailed`."""
    body = await _fetch_nodes(client, base_url, timeout, max_response_size)
    try:
        return parse_nodes(body, skipped)
    except ProtocolError as exc:
        raise LookupFailed(f"lookupd {base_url} sent an unusable answer: {exc!s:.200}") from exc


async def fetch_nsqds(
    client: HttpClient,
    base_url: str,
    *,
    timeout: float | None = None,
    max_response_size: int = MAX_RESPONSE_SIZE,
    skipped: list[Skipped] | None = None,
) -> tuple[Node, ...]:
    """``GET /nodes`` on one classic lookupd: every nsqd it knows, whatever its topics (see
    :func:`~smartnsq.lookup.model.parse_nsqds`). Failures raise :class:`LookupFailed`."""
    body = await _fetch_nodes(client, base_url, timeout, max_response_size)
    try:
        return parse_nsqds(body, skipped)
    except ProtocolError as exc:
        raise LookupFailed(f"lookupd {base_url} sent an unusable answer: {exc!s:.200}") from exc


async def _fetch_nodes(
    client: HttpClient, base_url: str, timeout: float | None, max_response_size: int
) -> Any:
    """The decoded body of a ``/nodes`` answer."""
    status, body = await fetch(
        client, base_url, "/nodes", timeout=timeout, max_response_size=max_response_size
    )
    if status in (403, 404, 405):
        raise NoNodes(f"lookupd {base_url} answered HTTP {status} to /nodes")
    if status != 200:
        raise LookupFailed(
            f"lookupd {base_url} answered HTTP {status} to /nodes{_redirect(status)}"
        )
    # One object per nsqd: its topics are strings, so count objects only.
    if body.count(b"{") > 2 * MAX_NODES + 16:
        raise LookupFailed(
            f"lookupd {base_url} sent an unusable answer to /nodes: it lists more than "
            f"{MAX_NODES} nsqd"
        )
    try:
        return loads(body)
    except (ValueError, RecursionError) as exc:
        raise LookupFailed(f"lookupd {base_url} sent an unusable answer: {exc!s:.200}") from exc


async def fetch_listlookup(
    client: HttpClient,
    base_url: str,
    *,
    timeout: float | None = None,
    max_response_size: int = MAX_RESPONSE_SIZE,
    skipped: list[Skipped] | None = None,
) -> tuple[list[str], str | None]:
    """``GET /listlookup`` on one lookupd: the cluster's lookupds and its leader, if any.

    A classic lookupd answers 404 (:class:`NoListLookup`); an empty or foreign answer lists
    nothing. Network errors, other
    statuses and answers late or too large raise :class:`LookupFailed`.
    """
    status, body = await fetch(
        client, base_url, "/listlookup", timeout=timeout, max_response_size=max_response_size
    )
    if status == 404:
        raise NoListLookup(f"lookupd {base_url} has no /listlookup (a classic lookupd)")
    if not body.strip():
        return [], None
    if status != 200:
        raise LookupFailed(
            f"lookupd {base_url} answered HTTP {status} to /listlookup{_redirect(status)}"
        )
    if too_many_nodes(body):
        raise LookupFailed(
            f"lookupd {base_url} sent an unusable answer to /listlookup: it lists more than "
            f"{MAX_NODES} entries"
        )
    try:
        data = loads(body)
    except (ValueError, RecursionError):
        return [], None  # not an HA lookupd: the seed is its own cluster
    return parse_listlookup(data, skipped)


def _redirect(status: int) -> str:
    if 300 <= status < 400:
        return " (a redirect; not followed: give the lookupd's own address)"
    return ""
