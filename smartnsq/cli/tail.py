"""``smartnsq tail TOPIC``: print messages as they arrive."""

from __future__ import annotations

import base64
import secrets
import sys
from typing import Any

import anyio
import click

from smartnsq import Consumer, Message, serve
from smartnsq.cli.options import Common, common, common_options
from smartnsq.cli.output import configure_logging, print_json
from smartnsq.cli.reach import check_reachable
from smartnsq.errors import NSQError

__all__ = ["command", "message_meta"]


@click.command("tail")
@click.argument("topic")
@click.option(
    "--channel",
    help="Read from this channel (shared with its other readers) instead of a private "
    "ephemeral one that nsqd deletes when tail exits.",
)
@click.option("-n", "--count", type=click.IntRange(min=1), help="Exit after COUNT messages.")
@click.option(
    "--show-meta",
    is_flag=True,
    help="Show attempts, nsqd, and on Youzan partition, offset, trace id and headers.",
)
@click.option(
    "--max-in-flight",
    type=click.IntRange(min=1),
    default=200,
    show_default=True,
    help="Messages nsqd may send ahead.",
)
@common_options
def command(
    topic: str, channel: str | None, count: int | None, show_meta: bool, max_in_flight: int
) -> int:
    """Print the messages of TOPIC as they arrive, one per line.

    By default from a new ephemeral channel, so only messages published from now on are shown
    and nothing is taken from other readers. Ctrl-C stops.
    """
    options = common()
    channel = channel or f"tail_{secrets.token_hex(4)}#ephemeral"
    if count is not None:
        # More in flight than wanted would only be requeued at the end.
        max_in_flight = min(max_in_flight, count)
    consumer = Consumer(topic, channel, max_in_flight=max_in_flight, **options.client_options())
    anyio.run(_tail, consumer, options, count, show_meta)
    return 0


async def _tail(consumer: Consumer, options: Common, count: int | None, show_meta: bool) -> None:
    await check_reachable(options, consumer.topic)
    configure_logging(options)  # after the check, whose failure is reported as one line
    out = sys.stdout.buffer

    async def main() -> None:
        seen = 0
        async for message in consumer:
            if options.json:
                print_json(message_record(message, show_meta))
            else:
                prefix = _meta_text(message_meta(message)) + "\t" if show_meta else ""
                out.write(prefix.encode() + message.body + b"\n")
                out.flush()
            seen += 1
            if count is not None and seen >= count:
                return

    await serve(consumer, main=main)


def message_meta(message: Message) -> dict[str, Any]:
    """Where a message came from: the Youzan fields only when it came from the fork."""
    meta: dict[str, Any] = {
        "id": message.id.decode("ascii", "replace")
        if message.partition is None
        else message.id.hex(),
        "timestamp": message.timestamp,
        "attempts": message.attempts,
        "nsqd": message.nsqd_address,
    }
    if message.partition is not None:
        meta["partition"] = message.partition
        meta["offset"] = message.offset
        meta["trace_id"] = message.trace_id
        try:
            meta["headers"] = message.headers
        except NSQError:
            meta["headers"] = None
    return meta


def message_record(message: Message, show_meta: bool) -> dict[str, Any]:
    """The JSON line for one message: ``body`` as text, or ``body_base64`` when not UTF-8."""
    record: dict[str, Any] = {}
    try:
        record["body"] = message.body.decode()
    except UnicodeDecodeError:
        record["body_base64"] = base64.b64encode(message.body).decode()
    if show_meta:
        record.update(message_meta(message))
    return record


def _meta_text(meta: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in meta.items() if k != "timestamp" and v not in (None, {}))
