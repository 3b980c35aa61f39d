"""``smartnsq to-file TOPIC --dir DIR``: archive a topic to files, like nsq_to_file."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Awaitable, Callable

import anyio
import click

from smartnsq import Consumer, Message, serve
from smartnsq.cli.buffers import buffer_options, consumer_buffer_options
from smartnsq.cli.options import CliError, Common, common, common_options
from smartnsq.cli.output import configure_logging, print_json
from smartnsq.cli.reach import check_reachable
from smartnsq.cli.sink import DEFAULT_DATETIME, DEFAULT_PATTERN, Sink, go_pattern
from smartnsq.cli.sink import host_identifier as host_identifier_of
from smartnsq.cli.status import Verdict, exit_now, signal_status
from smartnsq.cli.tail import RESERVED, topic_list
from smartnsq.cli.topics import TopicRunner
from smartnsq.cli.words import parse_duration, pass_through

__all__ = ["command", "parse_duration", "parse_size"]

_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str) -> int:
    """``1048576``, ``512K``, ``100M``, ``1G``: a size in bytes."""
    m = re.fullmatch(r"(\d+)\s*([kmg]?)i?b?", text.strip().lower())
    if not m or int(m.group(1)) == 0:
        raise click.BadParameter(f"{text!r} is not a size like 100M, 512K or 1048576")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2)]


# Consumer keywords the command's own flags set: refused by --consumer-opt.
_RESERVED = {**RESERVED, "concurrency": "--max-in-flight"}


@click.command("to-file")
@click.argument("topics", nargs=-1)
@click.option(
    "--topic", "topic_flags", multiple=True, help="A topic to archive (repeatable, like TOPIC)."
)
@click.option(
    "--topic-pattern",
    metavar="REGEX",
    help="Archive every topic lookupd knows whose name matches REGEX (searched, as Go's "
    "regexp.MatchString does), and new ones as they appear. Needs --lookupd.",
)
@click.option(
    "--topic-refresh",
    metavar="DURATION",
    default="1m",
    show_default=True,
    help="How often --topic-pattern asks lookupd for new topics.",
)
@click.option(
    "--dir",
    "--output-dir",
    "directory",
    required=True,
    type=click.Path(file_okay=False, writable=True),
    help="Directory for the files (created if missing).",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, writable=True),
    help="Write files here and move each to --dir once finished (rotated or at exit), so "
    "--dir only ever holds complete files.",
)
@click.option("--channel", default="nsq_to_file", show_default=True, help="Channel to consume.")
@click.option(
    "--pattern",
    "--filename-format",
    "pattern",
    default=DEFAULT_PATTERN,
    show_default=True,
    help="File name: {topic}, {hostname}, {rev}, {datetime}, {pid} (or nsq_to_file's "
    "<TOPIC>, <HOST>, <REV>, <DATETIME>, <PID>) and strftime codes (local time).",
)
@click.option(
    "--datetime-format",
    default=DEFAULT_DATETIME,
    show_default=True,
    help="strftime format of {datetime}: a new file whenever it changes.",
)
@click.option(
    "--host-identifier",
    metavar="TEXT",
    help="In place of the host name in {hostname}; <SHORT_HOST> and <HOSTNAME> are filled in.",
)
@click.option("--gzip", "compress", is_flag=True, help="Compress the files (.gz is added).")
@click.option(
    "--gzip-level",
    type=click.IntRange(1, 9),
    help="gzip level, 1 (fastest) to 9 (smallest); implies --gzip. Default 6.",
)
@click.option(
    "--skip-empty-files",
    is_flag=True,
    help="Accepted for nsq_to_file's sake: a file is only ever created for a message, so "
    "there are no empty files anyway.",
)
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
    help="Messages held (per topic) while their lines wait for an fsync.",
)
@click.option(
    "--consumer-opt",
    "consumer_opts",
    multiple=True,
    metavar="NAME=VALUE",
    help="Any other Consumer keyword (e.g. max_attempts=10); repeatable.",
)
@buffer_options
@common_options
def command(
    topics: tuple[str, ...],
    topic_flags: tuple[str, ...],
    topic_pattern: str | None,
    topic_refresh: str,
    directory: str,
    work_dir: str | None,
    channel: str,
    pattern: str,
    datetime_format: str,
    host_identifier: str | None,
    compress: bool,
    gzip_level: int | None,
    skip_empty_files: bool,
    rotate_size: str | None,
    rotate_interval: str | None,
    sync_interval: str,
    max_in_flight: int,
    consumer_opts: tuple[str, ...],
    output_buffer_timeout: str | None,
    output_buffer_size: str | None,
) -> int:
    """Write the messages of TOPICs to files in DIR, one line each, one file per hour.

    A message is finished only after its line has been flushed and fsynced, so Ctrl-C,
    SIGTERM or a crash lose nothing: on a signal, what is not written is requeued. A topic
    that does not exist yet is reported on stderr and waited for.
    """
    options = common()
    names = topic_list(topics, topic_flags)
    try:
        size = parse_size(rotate_size) if rotate_size else None
        interval = parse_duration(rotate_interval) if rotate_interval else None
        sync = parse_duration(sync_interval)
        refresh = parse_duration(topic_refresh)
        regex = re.compile(topic_pattern) if topic_pattern is not None else None
    except click.BadParameter as exc:
        raise click.UsageError(exc.message) from None
    except re.error as exc:
        raise click.UsageError(f"--topic-pattern {topic_pattern!r}: {exc}") from None
    if not names and regex is None:
        raise click.UsageError("name a topic: TOPIC, --topic TOPIC or --topic-pattern REGEX")
    if regex is not None and not options.lookupd:
        raise click.UsageError("--topic-pattern needs --lookupd (the topics come from lookupd)")
    pattern = go_pattern(pattern)
    if "/" in pattern or not pattern.strip():
        raise click.UsageError("--pattern is a file name inside --dir, without '/'")
    for path, flag in ((directory, "--dir"), (work_dir, "--work-dir")):
        try:
            if path is not None:
                os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise CliError(f"cannot create {flag} {path}: {exc.strerror}") from None
    extra = pass_through("--consumer-opt", consumer_opts, Consumer, _RESERVED)
    extra.update(consumer_buffer_options(output_buffer_timeout, output_buffer_size))
    client = options.client_options()
    archive = _Archive(options, sync)

    def sink(topic: str) -> Sink:
        return Sink(
            work_dir or directory,
            topic,
            pattern=pattern,
            compress=compress or gzip_level is not None,
            gzip_level=gzip_level or 6,
            rotate_size=size,
            rotate_interval=interval,
            group_size=max(1, max_in_flight // 2),
            output_dir=directory,
            host=host_identifier_of(host_identifier),
            datetime_format=datetime_format,
        )

    def consumer(topic: str, handle: Callable[[Message], Awaitable[None]]) -> Consumer:
        return Consumer(
            topic,
            channel,
            handle,
            max_in_flight=max_in_flight,
            concurrency=max_in_flight,  # every message in flight waits for its fsync
            **client,
            **extra,
        )

    archive.sink, archive.consumer = sink, consumer
    anyio.run(archive.run, names, regex, refresh)
    return archive.verdict.finish()


class _Archive:
    """One Sink and one Consumer per topic; a summary at the end."""

    def __init__(self, options: Common, sync: float) -> None:
        self.options = options
        self.sync = sync
        self.verdict = Verdict("to-file")
        self.runner: TopicRunner | None = None
        self.sinks: list[Sink] = []
        self.sink: Callable[[str], Sink]
        self.consumer: Callable[[str, Callable[[Message], Awaitable[None]]], Consumer]

    async def run(self, topics: list[str], regex: re.Pattern[str] | None, refresh: float) -> None:
        if not await check_reachable(self.options, topics[0] if topics else None, self.verdict):
            self._report()  # a signal during the check
            return
        configure_logging(self.options)  # after the check, whose failure is one line
        self.runner = TopicRunner(
            "to-file",
            self.options,
            self.topic,
            refresh=refresh,
            verdict=self.verdict,
            again=self._stop_now,
        )
        await self.runner.run(topics, regex)
        self._report()

    def _report(self) -> None:
        files = [f.path for sink in self.sinks for f in sink.closed]
        written = sum(sink.written for sink in self.sinks)
        if self.options.json:
            print_json(
                {
                    "topics": [s.topic for s in self.sinks],
                    "written": written,
                    "files": files,
                    **self.verdict.fields(),
                }
            )
        elif self.verdict.error is None and (sys.stderr.isatty() or self.options.verbose):
            how = "interrupted: " if self.verdict.interrupted else ""
            print(
                f"smartnsq to-file: {how}wrote {written} messages to {len(files)} files",
                file=sys.stderr,
            )

    def _stop_now(self, signum: int) -> None:
        # A second signal: end every open file at its last synced line (a valid file; the
        # messages not answered yet come back from nsqd) and leave without waiting.
        for sink in self.sinks:
            sink.abort()
        self._report()
        exit_now(signal_status(signum))

    def _failed(self, sink: Sink, exc: OSError) -> None:
        if self.verdict.error is None:
            why = exc.strerror or str(exc)
            self.verdict.fail(
                f"cannot write {sink.topic} to {sink.directory}: {why}; the files hold every "
                "line synced, the other messages stay in nsqd"
            )
        if self.runner is not None:
            self.runner.stop()

    async def topic(self, topic: str) -> None:
        sink = self.sink(topic)
        self.sinks.append(sink)

        async def handle(message: Message) -> None:
            try:
                await sink.append(message.body)
            except OSError as exc:
                # Not written: back to nsqd, and the whole command stops (one line, status 1)
                # rather than fail every message that follows.
                message.requeue(0, backoff=False)
                self._failed(sink, exc)

        try:
            # The syncer runs as serve()'s main: it is stopped only after the consumer, so
            # the handlers still running at the stop get their fsync and their FIN.
            await serve(
                self.consumer(topic, handle), main=lambda: sink.run_syncer(self.sync), signals=()
            )
        finally:
            with anyio.CancelScope(shield=True):
                await sink.close()
            if sink.error is not None:
                self._failed(sink, sink.error)
