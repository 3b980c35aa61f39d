"""``smartnsq pub TOPIC [FILES...]``: publish lines (or whole files) in batches."""

from __future__ import annotations

import json
import logging
import math
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import click

from smartnsq import Producer
from smartnsq.cli.lines import STDIN, Chunk, input_size, start_reader
from smartnsq.cli.options import Common, common, common_options
from smartnsq.cli.output import configure_logging, print_json
from smartnsq.cli.progress import PubProgress
from smartnsq.errors import NSQError, PartialPublish
from smartnsq.protocol.names import validate_topic

__all__ = ["command"]

# Batches failing one after another mean the cluster is not taking messages: stop reading.
MAX_FAILED_IN_A_ROW = 3
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130

Item = Chunk | BaseException | None  # from the reader: lines, its error, or the end


@dataclass
class Settings:
    topic: str
    sources: list[str]
    raw: bool
    key: str | None
    key_field: str | None
    partition: int | None
    trace: bool
    rate: float | None
    batch_size: int


@dataclass
class Tally:
    """What happened to the lines read so far."""

    read: int = 0
    published: int = 0
    failed: int = 0
    skipped: int = 0  # empty lines: nsqd rejects empty messages
    unconfirmed: int = 0  # sent, but the answer was cut short by a second Ctrl-C
    position: str = ""  # the last line taken from the input, to resume after an interruption
    interrupted: bool = False
    gave_up: bool = False


@click.command("pub")
@click.argument("topic")
@click.argument("files", nargs=-1, type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option("--raw", is_flag=True, help="Publish each file whole, as one message.")
@click.option("--key", help="Sharding key for every message (Youzan partitioned topics).")
@click.option(
    "--key-field",
    metavar="FIELD",
    help="Take each line's sharding key from this field of the line's JSON (a.b for nested).",
)
@click.option("--partition", type=click.IntRange(min=0), help="Publish to this partition.")
@click.option(
    "--trace", is_flag=True, help="Traced publish (Youzan): log each batch's trace record."
)
@click.option(
    "--rate", type=click.FloatRange(min=0, min_open=True), help="At most this many messages/s."
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=500,
    show_default=True,
    help="Messages per MPUB.",
)
@common_options
def command(
    topic: str,
    files: tuple[str, ...],
    raw: bool,
    key: str | None,
    key_field: str | None,
    partition: int | None,
    trace: bool,
    rate: float | None,
    batch_size: int,
) -> int:
    """Publish lines of FILES (or stdin) to TOPIC, one message per line.

    Every line is either acknowledged by nsqd or reported on stderr; the exit status is 1 if
    any line was not published. Ctrl-C stops reading, waits for the answers to what was sent
    and says how far it got. A progress bar is shown when stderr is a terminal.
    """
    options = common()
    validate_topic(topic)
    if sum(x is not None for x in (key, key_field, partition)) > 1:
        raise click.UsageError("choose one of --key, --key-field and --partition")
    if raw and key_field:
        raise click.UsageError("--key-field reads JSON lines; it cannot be used with --raw")
    if rate is not None:
        # Smaller batches keep the pace even: about 20 per second at the capped rate.
        batch_size = min(batch_size, max(1, math.ceil(rate / 20)))
    settings = Settings(
        topic, list(files) or [STDIN], raw, key, key_field, partition, trace, rate, batch_size
    )
    producer = Producer(**options.client_options())
    configure_logging(options)
    if trace:
        producer.trace.enable(topic)
        logging.getLogger("smartnsq.trace").setLevel(logging.INFO)
    tally = Tally()
    anyio.run(_publish, producer, settings, options, tally)
    return _report(settings, options, tally)


def _report(settings: Settings, options: Common, tally: Tally) -> int:
    if options.json:
        print_json(
            {
                "topic": settings.topic,
                "published": tally.published,
                "failed": tally.failed,
                "skipped_empty": tally.skipped,
                "unconfirmed": tally.unconfirmed,
                "interrupted": tally.interrupted,
                "position": tally.position or None,
            }
        )
    elif tally.interrupted or tally.failed or tally.gave_up or sys.stderr.isatty():
        how = "interrupted: " if tally.interrupted else ""
        text = f"smartnsq pub: {how}published {tally.published} messages to {settings.topic}"
        if tally.failed:
            text += f", {tally.failed} failed"
        if tally.unconfirmed:
            text += f", {tally.unconfirmed} sent without an answer (may or may not be published)"
        if tally.skipped:
            text += f", skipped {tally.skipped} empty lines"
        if (tally.interrupted or tally.gave_up) and tally.position:
            text += f"; input read up to {tally.position}"
        print(text, file=sys.stderr)
    if tally.failed or tally.unconfirmed or tally.gave_up:
        return EXIT_FAILED
    return EXIT_INTERRUPTED if tally.interrupted else 0


class _Publisher:
    """Takes chunks from the reader thread and publishes them, one batch at a time."""

    def __init__(
        self, producer: Producer, settings: Settings, options: Common, tally: Tally
    ) -> None:
        self.producer = producer
        self.settings = settings
        self.options = options
        self.tally = tally
        self.progress = PubProgress(input_size(settings.sources) if not settings.raw else None)
        self.stop_reading = threading.Event()
        self.reading = anyio.CancelScope()
        self.sending = anyio.CancelScope()
        self.failed_in_a_row = 0
        self.started = 0.0

    async def run(self) -> None:
        send, receive = anyio.create_memory_object_stream[Item](0)
        token = anyio.lowlevel.current_token()

        def emit(item: Item) -> None:
            try:
                anyio.from_thread.run(send.send, item, token=token)
            except Exception:  # the publisher has stopped listening: stop reading
                self.stop_reading.set()

        start_reader(self.settings.sources, self.settings.raw, emit, self.stop_reading)
        self.started = anyio.current_time()
        with self.progress, receive, send:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch_signals)
                with self.sending:
                    await self._loop(receive)
                tg.cancel_scope.cancel()
        self.stop_reading.set()

    async def _loop(self, receive: anyio.abc.ObjectReceiveStream[Item]) -> None:
        while not self.stop_reading.is_set():
            item: Item = None
            # A fresh scope each time (a scope is entered once): Ctrl-C cancels the wait only.
            self.reading = anyio.CancelScope()
            with self.reading:
                item = await receive.receive()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            self.tally.read += len(item.lines)
            self.tally.position = f"{item.source}:{item.last}"
            await self._publish_chunk(item)
            self.progress.update(self.tally, item.size)
            if self.failed_in_a_row >= MAX_FAILED_IN_A_ROW:
                self.tally.gave_up = True
                print(
                    f"smartnsq pub: {MAX_FAILED_IN_A_ROW} batches failed in a row; stopped",
                    file=sys.stderr,
                )
                return

    async def _watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                if not self.tally.interrupted:
                    # Stop taking input; what was taken is still sent and answered.
                    self.tally.interrupted = True
                    self.stop_reading.set()
                    self.reading.cancel()
                else:
                    self.sending.cancel()  # a second Ctrl-C: do not wait for the answers

    async def _publish_chunk(self, chunk: Chunk) -> None:
        groups: dict[str | int | None, list[tuple[int, bytes]]] = {}
        for n, body in enumerate(chunk.lines, chunk.first):
            if not body:
                self.tally.skipped += 1
                continue
            try:
                key = self._key(body)
            except ValueError as exc:
                self._failed(chunk.source, [n], str(exc))
                continue
            groups.setdefault(key, []).append((n, body))
        size = self.settings.batch_size
        unsent: list[int] = []
        for key, lines in groups.items():
            for start in range(0, len(lines), size):
                batch = lines[start : start + size]
                if self.failed_in_a_row >= MAX_FAILED_IN_A_ROW:
                    unsent.extend(n for n, _ in batch)
                else:
                    await self._publish_batch(chunk.source, key, batch)
        if unsent:
            unsent.sort()
            self._failed(chunk.source, unsent, "not sent: the batches before it failed")

    def _key(self, body: bytes) -> str | int | None:
        field = self.settings.key_field
        if field is None:
            return self.settings.key
        try:
            value = json.loads(body)
        except ValueError:
            raise ValueError(f"not JSON, so no --key-field {field}") from None
        for part in field.split("."):
            if not isinstance(value, dict) or part not in value:
                raise ValueError(f"no field {field!r} in the line's JSON")
            value = value[part]
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ValueError(f"field {field!r} is {type(value).__name__}, not a string or int")
        return value

    async def _publish_batch(
        self, source: str, key: str | int | None, lines: list[tuple[int, bytes]]
    ) -> None:
        rate = self.settings.rate
        if rate is not None:
            # Wait until the messages already sent are within the cap.
            due = self.started + (self.tally.published + self.tally.failed) / rate
            await anyio.sleep(max(0.0, due - anyio.current_time()))
        bodies = [body for _, body in lines]
        try:
            await self.producer.publish_many(
                self.settings.topic,
                bodies,
                sharding_key=key,
                partition=self.settings.partition,
            )
        except PartialPublish as exc:
            self.tally.published += exc.published
            self._failed(source, [n for n, _ in lines[exc.published :]], str(exc))
        except NSQError as exc:
            self._failed(source, [n for n, _ in lines], str(exc))
        except anyio.get_cancelled_exc_class():
            self.tally.unconfirmed += len(lines)
            raise
        else:
            self.tally.published += len(lines)
            self.failed_in_a_row = 0

    def _failed(self, source: str, numbers: list[int], error: str) -> None:
        self.tally.failed += len(numbers)
        self.failed_in_a_row += 1
        where = _ranges(numbers)
        if self.options.json:
            print_json({"source": source, "lines": where, "error": error})
        else:
            print(f"smartnsq pub: {source}: line {where} not published: {error}", file=sys.stderr)


def _ranges(numbers: Sequence[int]) -> str:
    """``1-3,7`` for [1, 2, 3, 7]."""
    out: list[str] = []
    i = 0
    while i < len(numbers):
        j = i
        while j + 1 < len(numbers) and numbers[j + 1] == numbers[j] + 1:
            j += 1
        out.append(str(numbers[i]) if i == j else f"{numbers[i]}-{numbers[j]}")
        i = j + 1
    return ",".join(out)


async def _publish(producer: Producer, settings: Settings, options: Common, tally: Tally) -> None:
    async with producer:
        await _Publisher(producer, settings, options, tally).run()
