"""The blocking twin of :func:`smartnsq.partition_offsets`."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from anyio.from_thread import start_blocking_portal

from smartnsq.offsets import PartitionOffsets
from smartnsq.offsets import partition_offsets as _partition_offsets


def partition_offsets(
    topic: str,
    *,
    lookupd_http_addresses: Sequence[str],
    channel: str | None = None,
    timeout: float = 10.0,
) -> list[PartitionOffsets]:
    """Offsets of every partition of a Youzan topic, sorted by partition (blocking).

    The same call as :func:`smartnsq.partition_offsets`, run on a short-lived event loop in
    a helper thread, so it also works from a thread that runs an event loop of its own.

    Args:
        topic: A topic of a Youzan HA cluster.
        lookupd_http_addresses: nsqlookupd HTTP addresses (``host:port``).
        channel: Also report this channel's position (``channel``, ``depth``).
        timeout: Seconds for the whole call.

    Returns:
        One :class:`smartnsq.PartitionOffsets` per partition, sorted by partition.
    """
    call = partial(
        _partition_offsets,
        topic,
        lookupd_http_addresses=lookupd_http_addresses,
        channel=channel,
        timeout=timeout,
    )
    with start_blocking_portal() as portal:
        return portal.call(call)
