"""``smartnsq tail TOPIC...``: print messages as they arrive."""

from __future__ import annotations

import base64
import os
import secrets
import select
import stat
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import click

from smartnsq import Consumer, Message
from smartnsq.cli.buffers import RESERVED as BUFFER_FLAGS
from smartnsq.cli.buffers import buffer_options, consumer_buffer_options
from smartnsq.cli.options import Common, common, common_options
from smartnsq.cli.output import configure_logging, print_json
from smartnsq.cli.reach import check_reachable
from smartnsq.cli.status import Verdict
from smartnsq.cli.topics import TopicRunner, serving
from smartnsq.cli.words import pass_through
from smartnsq.errors import NSQError
from smartnsq.protocol.names import validate_topic

__all__ = ["RESERVED", "command", "message_meta", "message_record", "topic_list"]


# Consumer keywords the command's own flags set: refused by --consumer-opt.
RESERVED = {
    "topic": "TOPIC / --topic",
    "channel": "--channel",
    "handler": "(none: the command handles messages)",
    "nsqd_tcp_addresses": "--nsqd",
    "lookupd_http_addresses": "--lookupd",
    "tls": "--tls",
    "auth_secret": "--auth-secret",
    "max_in_flight": "--max-in-flight",
    **BUFFER_FLAGS,
}


def topic_list(args: tuple[str, ...], flags: tuple[str, ...]) -> list[str]:
    """TOPIC arguments and --topic flags, in order, once each, validated."""
    topics = list(dict.fromkeys([*args, *flags]))
    for topic in topics:
        validate_topic(topic)
    return topics


@click.command("tail")
@click.argument("topics", nargs=-1)
@click.option(
    "--topic",
    "topic_flags",
    multiple=True,
    help="A topic to read (repeatable; same as TOPIC arguments, as nsq_tail's --topic).",
)
@click.option(
    "--channel",
    help="Read from this channel (shared with its other readers) instead of a private "
    "ephemeral one that nsqd deletes when tail exits.",
)
@click.option("-n", "--count", type=click.IntRange(min=1), help="Exit after COUNT messages.")
@click.option(
    "--print-topic", is_flag=True, help="Start each line with the message's topic and a tab."
)
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
    help="Messages nsqd may send ahead (per topic).",
)
@click.option(
    "--consumer-opt",
    "consumer_opts",
    multiple=True,
    metavar="NAME=VALUE",
    help="Any other Consumer keyword (e.g. snappy=true, sample_rate=10); repeatable.",
)
@buffer_options
@common_options
def command(
    topics: tuple[str, ...],
    topic_flags: tuple[str, ...],
    channel: str | None,
    count: int | None,
    print_topic: bool,
    show_meta: bool,
    max_in_flight: int,
    consumer_opts: tuple[str, ...],
    output_buffer_timeout: str | None,
    output_buffer_size: str | None,
) -> int:
    """Print the messages of TOPICs as they arrive, one per line.

    By default from a new ephemeral channel, so only messages published from now on are shown
    and nothing is taken from other readers. A topic that does not exist yet is reported on
    stderr and waited for. Ctrl-C stops.
    """
    options = common()
    names = topic_list(topics, topic_flags)
    if not names:
        raise click.UsageError("name a topic: TOPIC or --topic TOPIC")
    channel = channel or f"tail_{secrets.token_hex(4)}#ephemeral"
    if count is not None:
        # More in flight than wanted would only be requeued at the end.
        max_in_flight = min(max_in_flight, count)
    extra = pass_through("--consumer-opt", consumer_opts, Consumer, RESERVED)
    extra.update(consumer_buffer_options(output_buffer_timeout, output_buffer_size))
    client = options.client_options()
    printer = _Printer(options, count, print_topic, show_meta)

    def make(topic: str) -> Consumer:
        return Consumer(
            topic, channel, printer.handler(topic), max_in_flight=max_in_flight, **client, **extra
        )

    anyio.run(_tail, printer, options, names, make)
    return printer.verdict.finish()


class _Printer:
    """The handler of every topic's Consumer: prints, counts, stops at --count."""

    def __init__(
        self, options: Common, count: int | None, print_topic: bool, show_meta: bool
    ) -> None:
        self.options = options
        self.count = count
        self.print_topic = print_topic
        self.show_meta = show_meta
        self.seen = 0
        self.reader_gone = False  # stdout cannot be written any more
        self.verdict = Verdict("tail")
        self.runner: TopicRunner | None = None
        self.out = sys.stdout.buffer

    def handler(self, topic: str) -> Callable[[Message], Awaitable[None]]:
        async def handle(message: Message) -> None:
            if self.reader_gone:
                message.requeue(0, backoff=False)
                return
            try:
                self.show(topic, message)
            except OSError as exc:
                # Not printed: back to the channel, and tail stops (a reader gone is a normal
                # end, as for '| head'; a full disk is a failure) rather than fail every message.
                message.requeue(0, backoff=False)
                self._cannot_print(exc)

        return handle

    def reader_went_away(self) -> None:
        self._cannot_print(BrokenPipeError())

    def _cannot_print(self, exc: OSError) -> None:
        if not self.reader_gone:
            self.reader_gone = True
            if not isinstance(exc, BrokenPipeError):
                self.verdict.fail(f"cannot write to stdout: {exc.strerror or exc}")
            # What is still buffered can never be written: drop it, quietly at exit too.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        if self.runner is not None:
            self.runner.stop()

    def show(self, topic: str, message: Message) -> None:
        if self.count is not None and self.seen >= self.count:
            # Arrived after the last one wanted: back to the channel, untouched.
            message.requeue(0, backoff=False)
            return
        self.seen += 1
        if self.options.json:
            record = message_record(message, self.show_meta)
            if self.print_topic:
                record = {"topic": topic, **record}
            print_json(record)
        else:
            prefix = topic + "\t" if self.print_topic else ""
            if self.show_meta:
                prefix += _meta_text(message_meta(message)) + "\t"
            self.out.write(prefix.encode() + message.body + b"\n")
            self.out.flush()
        if self.count is not None and self.seen >= self.count and self.runner is not None:
            self.runner.stop()


async def _tail(
    printer: _Printer, options: Common, topics: list[str], make: Callable[[str], Consumer]
) -> None:
    await check_reachable(options, topics[0])
    configure_logging(options)  # after the check, whose failure is reported as one line
    printer.runner = TopicRunner("tail", options, serving(make), verdict=printer.verdict)
    async with anyio.create_task_group() as tg:
        tg.start_soon(_watch_reader, printer)
        await printer.runner.run(topics)
        tg.cancel_scope.cancel()


async def _watch_reader(printer: _Printer) -> None:
    """stdout is a pipe: notice its reader going away ('| head') while no message comes,
    rather than at the next write."""
    fd = sys.stdout.fileno()
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        return
    poller = select.poll()
    poller.register(fd, 0)  # POLLERR (no reader left) is reported whatever is asked
    while not poller.poll(0):
        await anyio.sleep(0.2)
    printer.reader_went_away()


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
