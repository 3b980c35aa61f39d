"""Opening a connection to nsqd: the TCP connect, then the handshake.

:func:`dial` connects; :func:`handshake` drives the sans-IO
:class:`~smartnsq.protocol.handshake.Handshake` (magic, IDENTIFY, TLS, Snappy or DEFLATE,
AUTH) over the link. Both turn every way of failing into a typed error naming the nsqd.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import anyio

from smartnsq.errors import ConnectFailed, NSQError
from smartnsq.net.transport import Link, open_link
from smartnsq.protocol.frames import FrameDecoder
from smartnsq.protocol.handshake import (
    ConnectionConfig,
    Features,
    Handshake,
    Send,
    StartTLS,
    Step,
    parse_address,
)

__all__ = ["Handshaken", "dial", "handshake"]


class Handshaken(NamedTuple):
    """What the handshake settled."""

    features: Features  # what nsqd agreed to in IDENTIFY
    auth: Mapping[str, Any] | None  # nsqd's answer to AUTH, or None
    decompress: Callable[[bytes], bytes] | None  # for what arrives from now on


async def dial(address: str, config: ConnectionConfig) -> tuple[str, Link]:
    """Connect to ``address`` within ``config.connect_timeout``.

    Returns:
        The host (what TLS checks the certificate against by default) and the link.

    Raises:
        ConnectFailed: Refused, unreachable or timed out.
        InvalidArgument: ``address`` is not a valid ``host:port``.
    """
    host, port = parse_address(address)
    try:
        with anyio.fail_after(config.connect_timeout):
            return host, await open_link(host, port)
    except TimeoutError:
        raise ConnectFailed(
            f"connecting to nsqd {address} timed out after {config.connect_timeout}s"
        ) from None
    except OSError as exc:
        raise ConnectFailed(f"cannot connect to nsqd {address}: {exc}") from exc


async def handshake(
    link: Link, decoder: FrameDecoder, address: str, host: str, config: ConnectionConfig
) -> Handshaken:
    """Handshake over ``link`` within ``config.handshake_timeout``; on failure the link is
    closed. Frames read past the handshake stay in ``decoder``.

    Raises:
        ConnectFailed: The handshake failed or timed out (``InsecureAuth`` included).
        ServerError: nsqd refused IDENTIFY or AUTH.
        ProtocolError: The peer does not speak NSQ.
    """
    try:
        with anyio.fail_after(config.handshake_timeout):
            return await _exchange(link, decoder, address, host, config)
    except TimeoutError:
        await link.aclose()
        raise ConnectFailed(
            f"handshake with nsqd {address} timed out after {config.handshake_timeout}s"
        ) from None
    except NSQError:  # ConnectFailed is an OSError too: keep the precise error
        await link.aclose()
        raise
    except (OSError, anyio.EndOfStream, anyio.BrokenResourceError, ssl.SSLError) as exc:
        await link.aclose()
        raise ConnectFailed(f"handshake with nsqd {address} failed: {exc!r}") from exc
    except BaseException:
        await link.aclose()
        raise


async def _exchange(
    link: Link, decoder: FrameDecoder, address: str, host: str, config: ConnectionConfig
) -> Handshaken:
    hs = Handshake(address, host, config)
    decompress: Callable[[bytes], bytes] | None = None
    step: Step | bytes | None = hs.start()
    while step is not None:
        if isinstance(step, bytes):  # a heartbeat to answer
            link.write(step)
            await link.drain()
        elif isinstance(step, Send):
            link.write(step.data)
            await link.drain()
        elif isinstance(step, StartTLS):
            await link.start_tls(step.context, step.hostname)
        else:
            rest = decoder.take_remaining()
            link.compress, decompress = step.compress, step.decompress
            if rest:
                decoder.append(step.decompress(rest))
        # The next frame, reading more as needed.
        frame = decoder.next_frame()
        while frame is None:
            data = await link.receive()
            decoder.append(decompress(data) if decompress is not None else data)
            frame = decoder.next_frame()
        step = hs.reply(*frame)
    return Handshaken(hs.features, hs.auth, decompress)
