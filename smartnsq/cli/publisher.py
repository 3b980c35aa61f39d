"""The publishing loop of ``smartnsq pub``: chunks from the reader thread, in batches, with
the resume point kept as the last line up to which nsqd acknowledged everything."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel

from smartnsq import Producer
from smartnsq.cli.lines import Chunk, input_size, start_reader
from smartnsq.cli.output import print_json
from smartnsq.cli.progress import PubProgress
from smartnsq.cli.status import Verdict
from smartnsq.cli.tally import Tally
from smartnsq.cli.words import flag_words
from smartnsq.errors import (
    ConnectFailed,
    ConnectionClosed,
    MessageTooLarge,
    NSQError,
    NSQTimeout,
    PartialPublish,
)

__all__ = ["MAX_FAILED_IN_A_ROW", "Publisher", "Settings", "ranges"]

# Batches failing one after another mean the cluster is not taking messages: stop reading.
MAX_FAILED_IN_A_ROW = 3

Item = Chunk | BaseException | None  # from the reader: lines, its error, or the end
Key = str | int | None


@dataclass
class Settings:
    topic: str
    sources: list[str]
    raw: bool = False
    key: str | None = None
    key_field: str | None = None
    use_keys: bool = True  # False on a classic nsqd without lookupd: no partitions to pick
    partition: int | None = None
    rate: float | None = None
    batch_size: int = 500
    delimiter: bytes = b"\n"
    delay: float | None = None
    # Resume: skip every line up to (source label, line), and the sources before it.
    resume: tuple[str, int] | None = None
    json: bool = False


@dataclass
class Failure:
    """Lines of one source that were not published, and why (listed by --json)."""

    source: str
    lines: list[int]
    error: str


@dataclass
class _Mark:
    """Which lines of the chunk being published are done (acknowledged, or empty)."""

    chunk: Chunk
    done: bytearray = field(init=False)
    acked: bytearray = field(init=False)

    def __post_init__(self) -> None:
        self.done = bytearray(len(self.chunk.lines))
        self.acked = bytearray(len(self.chunk.lines))


class Publisher:
    """Takes chunks from the reader thread and publishes them, one batch at a time.

    The first SIGINT (or SIGTERM) stops sending at the next batch: the batch in flight is
    answered, nothing more is sent. A second one stops waiting for that answer.
    """

    def __init__(self, producer: Producer, settings: Settings, tally: Tally) -> None:
        self.verdict = Verdict("pub")
        self.producer = producer
        self.settings = settings
        self.tally = tally
        self.failures: list[Failure] = []
        self.progress = PubProgress(input_size(settings.sources) if not settings.raw else None)
        self.stop_reading = threading.Event()
        self.waiting = anyio.CancelScope()  # a wait that is not a publish: input, --rate
        self.sending = anyio.CancelScope()
        self.failed_in_a_row = 0
        self.started = 0.0
        self.sent = 0
        self.contiguous = True  # no line so far failed or was left out
        # Resume: sources before the resume source are skipped whole.
        self.skipping = settings.resume is not None

    async def run(self) -> None:
        send, receive = anyio.create_memory_object_stream[Item](0)
        token = anyio.lowlevel.current_token()

        def emit(item: Item) -> None:
            if self.stop_reading.is_set():
                # Nobody takes it any more; handing it over could outlive the event loop
                # (a coroutine never awaited, warned about at exit).
                return
            try:
                anyio.from_thread.run(send.send, item, token=token)
            except BaseException:  # the publisher stopped listening: stop reading
                self.stop_reading.set()

        start_reader(
            self.settings.sources,
            self.settings.raw,
            emit,
            self.stop_reading,
            self.settings.delimiter,
        )
        self.started = anyio.current_time()
        with self.progress, receive, send:
            async with anyio.create_task_group() as tg:
                watch = self.verdict.watch_signals
                tg.start_soon(watch, self._interrupted, self._interrupted_again)
                with self.sending:
                    await self._loop(receive)
                tg.cancel_scope.cancel()
        self.stop_reading.set()

    def _stopped(self) -> bool:
        return self.tally.interrupted or self.failed_in_a_row >= MAX_FAILED_IN_A_ROW

    async def _loop(self, receive: anyio.abc.ObjectReceiveStream[Item]) -> None:
        while not self._stopped():
            item: Item = None
            # A fresh scope each time (a scope is entered once): Ctrl-C cancels the wait only.
            self.waiting = anyio.CancelScope()
            with self.waiting:
                item = await receive.receive()
            if self.tally.interrupted or item is None:
                return
            if isinstance(item, BaseException):
                raise item
            self.tally.read += len(item.lines)
            mark = _Mark(item)
            try:
                await self._publish_chunk(mark)
            finally:
                self._advance(mark)
            self.progress.update(self.tally, item.size)
        if self.failed_in_a_row >= MAX_FAILED_IN_A_ROW:
            self.tally.gave_up = True
            self.stop_reading.set()

    def _interrupted(self) -> None:
        # Stop taking input and sending; the batch in flight is still answered.
        self.tally.interrupted = True
        self.stop_reading.set()
        self.waiting.cancel()

    def _interrupted_again(self, signum: int) -> None:
        self.sending.cancel()  # a second Ctrl-C: do not wait for the answer

    def _resumed(self, chunk: Chunk) -> int:
        """How many leading lines of ``chunk`` the resume point skips."""
        if self.settings.resume is None:
            return 0
        source, line = self.settings.resume
        if chunk.source == source:
            self.skipping = False
            return max(0, min(len(chunk.lines), line - chunk.first + 1))
        return len(chunk.lines) if self.skipping else 0

    async def _publish_chunk(self, mark: _Mark) -> None:
        chunk = mark.chunk
        groups: dict[Key, list[tuple[int, bytes]]] = {}
        resumed = self._resumed(chunk)
        self.tally.resumed += resumed
        for i in range(resumed):
            mark.done[i] = 1
        for i, body in enumerate(chunk.lines):
            if mark.done[i]:
                continue
            if not body:
                self.tally.skipped += 1
                mark.done[i] = 1
                continue
            try:
                key = self._key(body)
            except ValueError as exc:
                self._failed(chunk.source, [chunk.first + i], str(exc), cluster=False)
                continue
            groups.setdefault(key, []).append((i, body))
        size = self.settings.batch_size
        for key, lines in groups.items():
            for start in range(0, len(lines), size):
                if self._stopped():
                    return
                await self._publish_batch(mark, key, lines[start : start + size])

    def _key(self, body: bytes) -> Key:
        field_name = self.settings.key_field
        if field_name is None:
            return self.settings.key if self.settings.use_keys else None
        try:
            value: Any = json.loads(body)
        except ValueError:
            raise ValueError(f"not JSON, so no --key-field {field_name}") from None
        for part in field_name.split("."):
            if not isinstance(value, dict) or part not in value:
                raise ValueError(f"no field {field_name!r} in the line's JSON")
            value = value[part]
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ValueError(f"field {field_name!r} is {type(value).__name__}, not a string or int")
        return value if self.settings.use_keys else None

    async def _pace(self) -> None:
        rate = self.settings.rate
        if rate is None:
            return
        # Wait until the messages already sent are within the cap (Ctrl-C cuts it short).
        due = self.started + self.sent / rate
        self.waiting = anyio.CancelScope()
        with self.waiting:
            await anyio.sleep(max(0.0, due - anyio.current_time()))

    async def _publish_batch(self, mark: _Mark, key: Key, lines: list[tuple[int, bytes]]) -> None:
        await self._pace()
        if self._stopped():
            return
        source, first = mark.chunk.source, mark.chunk.first
        self.sent += len(lines)
        acked = 0
        try:
            acked = await self._send(key, [body for _, body in lines])
        except PartialPublish as exc:
            acked = exc.published
            self._failed(source, [first + i for i, _ in lines[acked:]], str(exc))
        except MessageTooLarge as exc:
            # Nothing was sent. The line is at fault, not the batch nor the cluster: halve
            # the batch until the lines too large fail alone and the others go out.
            self.sent -= len(lines)
            if len(lines) == 1:
                self._failed(source, [first + lines[0][0]], str(exc), cluster=False)
                return
            half = len(lines) // 2
            await self._publish_batch(mark, key, lines[:half])
            await self._publish_batch(mark, key, lines[half:])
        except NSQError as exc:
            unknown = _outcome_unknown(exc)
            self._failed(source, [first + i for i, _ in lines], str(exc), unknown=unknown)
        except anyio.get_cancelled_exc_class():
            self.tally.unconfirmed += len(lines)
            raise
        else:
            self.failed_in_a_row = 0
        finally:
            self.tally.published += acked
            for i, _ in lines[:acked]:
                mark.done[i] = mark.acked[i] = 1

    async def _send(self, key: Key, bodies: list[bytes]) -> int:
        """Publish ``bodies``; how many were acknowledged (PartialPublish when not all)."""
        settings = self.settings
        if settings.delay is None:
            await self.producer.publish_many(
                settings.topic, bodies, sharding_key=key, partition=settings.partition
            )
            return len(bodies)
        # DPUB takes one message at a time.
        for n, body in enumerate(bodies):
            try:
                await self.producer.publish(
                    settings.topic,
                    body,
                    delay=settings.delay,
                    sharding_key=key,
                    partition=settings.partition,
                )
            except NSQError as exc:
                if n == 0:
                    raise
                raise PartialPublish(str(exc), n) from exc
        return len(bodies)

    def _advance(self, mark: _Mark) -> None:
        """Move the resume point over the chunk's leading done lines."""
        chunk = mark.chunk
        if not self.contiguous:
            self.tally.beyond += sum(mark.acked)
            return
        prefix = mark.done.find(0)
        if prefix == -1:
            prefix = len(chunk.lines)
        else:
            self.contiguous = False
            self.tally.beyond += sum(mark.acked[prefix:])
        if prefix:
            self.tally.position = f"{chunk.source}:{chunk.first + prefix - 1}"

    def _failed(
        self,
        source: str,
        numbers: list[int],
        error: str,
        cluster: bool = True,
        unknown: bool = False,
    ) -> None:
        """Count lines not published; ``cluster``: the cluster refused them (not the input);
        ``unknown``: sent without an answer, they may have been published."""
        if not numbers:
            return
        error = flag_words(error)
        if unknown:
            self.tally.unconfirmed += len(numbers)
        else:
            self.tally.failed += len(numbers)
        self.failed_in_a_row += cluster
        self.failures.append(Failure(source, numbers, error))
        if self.settings.json:
            print_json({"source": source, "lines": ranges(numbers), "error": error})


def _outcome_unknown(exc: NSQError) -> bool:
    """Sent, but no answer came (in time, or before the connection ended): nsqd may have
    stored the messages. A connection that could not be opened sent nothing."""
    if isinstance(exc, NSQTimeout):
        return True
    return isinstance(exc, ConnectionClosed) and not isinstance(exc, ConnectFailed)


def ranges(numbers: Sequence[int]) -> str:
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
