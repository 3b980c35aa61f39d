"""Querying nsqlookupd over HTTP."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from smartnsq.errors import InvalidArgument, LookupFailed, ProtocolError, TopicNotFound
from smartnsq.lookup.model import Skipped, TopicLayout, loads, parse_listlookup, parse_lookup

if TYPE_CHECKING:  # httpx is imported where a lookupd address is parsed or asked, not before
    import httpx

# identity: the size cap counts the bytes we keep, not a compressed stream that may inflate.
ACCEPT = {"Accept": "application/vnd.nsq; version=1.0", "Accept-Encoding": "identity"}

MAX_RESPONSE_SIZE = 4 << 20


@functools.cache
def tls_verify() -> Any:
    """httpx's default certificate check, built once per process for every client to share.

    httpx builds a new SSL context (trust store loaded) for each client it makes unless it is
    given one: about 40 ms here, paid by every Consumer, Producer and offsets call.
    """
    import httpx

    make = getattr(httpx, "create_ssl_context", None)  # httpx >= 0.28
    return make() if make is not None else True


class NoListLookup(LookupFailed):
    """The lookupd answers 404 to ``/listlookup``: a classic lookupd, not worth asking again."""


def normalize_lookupd_address(address: str) -> str:
    """``host:port`` or ``http(s)://host:port[/]`` -> base URL without trailing slash."""
    if not isinstance(address, str) or not address.strip():
        raise InvalidArgument(f"lookupd address must be 'host:port' or a URL, not {address!r}")
    address = address.strip().rstrip("/")
    url = address if "://" in address else f"http://{address}"
    import httpx

    try:
        parsed = httpx.URL(url)
    except Exception as exc:  # httpx raises several types for bad URLs
        raise InvalidArgument(f"lookupd address {address!r} is not a valid URL") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host or parsed.port is None:
        raise InvalidArgument(f"lookupd address {address!r} must look like host:port")
    return url


def check_lookupd_addresses(addresses: Sequence[str] | str) -> list[str]:
    """Normalize one or several lookupd addresses, dropping duplicates."""
    if isinstance(addresses, str):
        addresses = [addresses]
    return list(dict.fromkeys(normalize_lookupd_address(a) for a in addresses))


async def fetch(
    client: httpx.AsyncClient,
    base_url: str,
    path: str,
    params: Mapping[str, str] | None = None,
    *,
    timeout: float | None = None,
    max_response_size: int = MAX_RESPONSE_SIZE,
) -> tuple[int, bytes]:
    """``GET base_url + path``: the status and the whole body.

    ``timeout`` bounds the whole request, body included (httpx's own timeouts are per read,
    so a server sending a byte now and then would never time out), and the body is read up
    to ``max_response_size`` bytes. Failures raise :class:`LookupFailed`.
    """
    import httpx

    with anyio.move_on_after(timeout):
        try:
            async with client.stream(
                "GET", f"{base_url}{path}", params=params, headers=ACCEPT
            ) as r:
                body = bytearray()
                async for chunk in r.aiter_bytes():
                    body += chunk
                    if len(body) > max_response_size:
                        raise LookupFailed(
                            f"lookupd {base_url} sent more than {max_response_size} bytes for "
                            f"{path} (max_response_size); its answer is ignored"
                        )
                return r.status_code, bytes(body)
        except httpx.HTTPError as exc:
            raise LookupFailed(f"lookupd {base_url} unreachable: {exc!r}") from exc
    raise LookupFailed(f"lookupd {base_url} did not answer {path} within {timeout}s")


async def fetch_lookup(
    client: httpx.AsyncClient,
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
        raise LookupFailed(f"lookupd {base_url} answered HTTP {status}")
    try:
        return parse_lookup(loads(body), skipped)
    except (ValueError, RecursionError, ProtocolError) as exc:
        raise LookupFailed(f"lookupd {base_url} sent an unusable answer: {exc!s:.200}") from exc


async def fetch_listlookup(
    client: httpx.AsyncClient,
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
        raise LookupFailed(f"lookupd {base_url} answered HTTP {status} to /listlookup")
    try:
        data = loads(body)
    except (ValueError, RecursionError):
        return [], None  # not an HA lookupd: the seed is its own cluster
    return parse_listlookup(data, skipped)
