"""``smartnsq to-file TOPIC --dir DIR``: archive a topic to files, like nsq_to_file."""

from __future__ import annotations

import os
import re
import sys

import anyio
import click

from smartnsq import Consumer, Message, serve
from smartnsq.cli.options import CliError, Common, common, common_options
from smartnsq.cli.output import configure_logging, print_json
from smartnsq.cli.reach import check_reachable
from smartnsq.cli.sink import DEFAULT_PATTERN, Sink

__all__ = ["command", "parse_duration", "parse_size"]

_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_TIME_UNITS = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_size(text: str) -> int:
    """``1048576``, ``512K``, ``100M``, ``1G``: a size in bytes."""
    m = re.fullmatch(r"(\d+)\s*([kmg]?)i?b?", text.strip().lower())
    if not m or int(m.group(1)) == 0:
        raise click.BadParameter(f"{text!r} is not a size like 100M, 512K or 1048576")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2)]


def parse_duration(text: str) -> float:
    """``30`` (seconds), ``250ms``, ``10s``, ``5m``, ``1h``: a duration in seconds."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|)", text.strip().lower())
    if not m or float(m.group(1)) == 0:
        raise click.BadParameter(f"{text!r} is not a duration like 250ms, 30s, 5m or 1h")
    return float(m.group(1)) * _TIME_UNITS[m.group(2)]


@click.command("to-file")
@click.argument("topic")
@click.option(
    "--dir",
    "directory",
    required=True,
    type=click.Path(file_okay=False, writable=True),
    help="Directory for the files (created if missing).",
)
@click.option("--channel", default="nsq_to_file", show_default=True, help="Channel to consume.")
@click.option(
    "--pattern",
    default=DEFAULT_PATTERN,
    show_default=True,
    help="File name: {topic}, {hostname}, {rev} and strftime codes (local time).",
)
@click.option("--gzip", "compress", is_flag=True, help="Compress the files (.gz is added).")
@click.option("--rotate-size", metavar="SIZE", help="Start a new file after SIZE (e.g. 100M).")
@click.option(
    "--rotate-interval", metavar="DURATION", help="Start a new file after DURATION (e.g. 10m)."
)
@click.option(
    "--sync-interval",
    metavar="DURATION",
    default="100ms",
    show_default=True,
    help="Longest wait before an fsync (messages are answered after it).",
)
@click.option(
    "--max-in-flight",
    type=click.IntRange(min=1),
    default=200,
    show_default=True,
    help="Messages held while their lines wait for an fsync.",
)
@common_options
def command(
    topic: str,
    directory: str,
    channel: str,
    pattern: str,
    compress: bool,
    rotate_size: str | None,
    rotate_interval: str | None,
    sync_interval: str,
    max_in_flight: int,
) -> int:
    """Write the messages of TOPIC to files in DIR, one line each, one file per hour.

    A message is finished only after its line has been flushed and fsynced, so Ctrl-C,
    SIGTERM or a crash lose nothing: on a signal, what is not written is requeued.
    """
    options = common()
    try:
        size = parse_size(rotate_size) if rotate_size else None
        interval = parse_duration(rotate_interval) if rotate_interval else None
        sync = parse_duration(sync_interval)
    except click.BadParameter as exc:
        raise click.UsageError(exc.message) from None
    if "/" in pattern or not pattern.strip():
        raise click.UsageError("--pattern is a file name inside --dir, without '/'")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot create --dir {directory}: {exc.strerror}") from None
    sink = Sink(
        directory,
        topic,
        pattern=pattern,
        compress=compress,
        rotate_size=size,
        rotate_interval=interval,
        group_size=max(1, max_in_flight // 2),
    )

    async def handle(message: Message) -> None:
        await sink.append(message.body)

    consumer = Consumer(
        topic,
        channel,
        handle,
        max_in_flight=max_in_flight,
        concurrency=max_in_flight,  # every message in flight waits for its fsync in a handler
        **options.client_options(),
    )
    anyio.run(_archive, consumer, sink, options, sync)
    return 0


async def _archive(consumer: Consumer, sink: Sink, options: Common, sync: float) -> None:
    await check_reachable(options, consumer.topic)
    configure_logging(options)  # after the check, whose failure is reported as one line
    try:
        # The syncer runs as serve()'s main: it is stopped only after the consumer, so the
        # handlers still running at the stop get their fsync and their FIN.
        await serve(consumer, main=lambda: sink.run_syncer(sync))
    finally:
        with anyio.CancelScope(shield=True):
            await sink.close()
    files = [f.path for f in sink.closed]
    if options.json:
        print_json({"topic": consumer.topic, "written": sink.written, "files": files})
    elif sys.stderr.isatty() or options.verbose:
        print(
            f"smartnsq to-file: wrote {sink.written} messages to {len(files)} files",
            file=sys.stderr,
        )
