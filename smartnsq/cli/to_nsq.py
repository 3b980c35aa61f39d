"""``smartnsq to-nsq TOPIC --to DST``: consume a topic and republish it (nsq_to_nsq), the way
to replay a dead-letter topic. A message is finished only after the destination nsqd
acknowledged its copy: at least once, nothing lost on a crash or a failed publish."""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import click

from smartnsq import Consumer, Message, Producer
from smartnsq.cli.jsonfilter import JsonFilter, json_filter_options
from smartnsq.cli.keyorder import KeyOrder
from smartnsq.cli.options import Common, common, common_options, split_addresses
from smartnsq.cli.output import configure_logging, print_json
from smartnsq.cli.progress import PubProgress
from smartnsq.cli.reach import check_reachable
from smartnsq.cli.status import Verdict
from smartnsq.cli.tail import RESERVED, topic_list
from smartnsq.cli.tally import Tally
from smartnsq.cli.topics import TopicRunner, serving
from smartnsq.cli.words import flag_words, never_give_up, parse_duration, pass_through
from smartnsq.errors import (
    ExtNotSupported,
    NotSupported,
    NSQError,
    TopicNotExist,
    TopicNotFound,
)
from smartnsq.protocol.names import validate_topic

__all__ = ["command"]

log = logging.getLogger("smartnsq.cli")

_PRODUCER_RESERVED = {
    "nsqd_tcp_addresses": "--to-nsqd",
    "lookupd_http_addresses": "--to-lookupd",
    "tls": "--tls",
    "auth_secret": "--auth-secret",
}


@click.command("to-nsq")
@click.argument("topics", nargs=-1)
@click.option("--topic", "topic_flags", multiple=True, help="A topic to copy (repeatable).")
@click.option("--channel", default="nsq_to_nsq", show_default=True, help="Channel to consume.")
@click.option(
    "--to",
    "destination",
    metavar="TOPIC",
    help="Topic to publish to; default: each topic's own name (then give --to-nsqd or "
    "--to-lookupd).",
)
@click.option(
    "--to-nsqd",
    multiple=True,
    metavar="HOST:PORT",
    help="Destination nsqd TCP address (repeatable); default: the source's addresses.",
)
@click.option(
    "--to-lookupd",
    multiple=True,
    metavar="HOST:PORT",
    help="Destination nsqlookupd HTTP address (repeatable); default: the source's.",
)
@click.option(
    "--rate", type=click.FloatRange(min=0, min_open=True), help="At most this many messages/s."
)
@click.option("--limit", type=click.IntRange(min=1), help="Stop after copying LIMIT messages.")
@click.option(
    "--idle-timeout",
    metavar="DURATION",
    help="Stop once no message came for DURATION (default 10s with --limit, else never); "
    "with --limit not reached, the exit status is 1.",
)
@click.option(
    "--give-up-after",
    metavar="DURATION",
    help="Stop (status 1) once copies have failed for DURATION with none copied in between "
    "(default 60s; 0: never, as nsq_to_nsq).",
)
@click.option(
    "--key-header",
    metavar="NAME",
    help="Youzan: the sharding key of each copy is this header of the message.",
)
@click.option(
    "--same-partition",
    is_flag=True,
    help="Youzan: publish each copy to the partition number the message came from.",
)
@click.option(
    "--max-in-flight",
    type=click.IntRange(min=1),
    default=200,
    show_default=True,
    help="Messages held while their copies are published.",
)
@click.option("--consumer-opt", "consumer_opts", multiple=True, metavar="NAME=VALUE")
@click.option("--producer-opt", "producer_opts", multiple=True, metavar="NAME=VALUE")
@json_filter_options
@common_options
def command(
    topics: tuple[str, ...],
    topic_flags: tuple[str, ...],
    channel: str,
    destination: str | None,
    to_nsqd: tuple[str, ...],
    to_lookupd: tuple[str, ...],
    rate: float | None,
    limit: int | None,
    idle_timeout: str | None,
    give_up_after: str | None,
    key_header: str | None,
    same_partition: bool,
    max_in_flight: int,
    consumer_opts: tuple[str, ...],
    producer_opts: tuple[str, ...],
    require_json_field: str | None,
    require_json_value: str | None,
    whitelist_json_fields: tuple[str, ...],
) -> int:
    """Copy the messages of TOPICs to another topic or cluster (nsq_to_nsq).

    Each message is finished only once the destination acknowledged its copy; a failed
    publish requeues it, and copies failing again and again end the command (status 1), the
    messages left in the source. Youzan ext headers and trace ids are kept where the
    destination takes them. Replays a dead-letter topic: smartnsq to-nsq orders.dead --to orders.
    """
    options = common()
    names = topic_list(topics, topic_flags)
    if not names:
        raise click.UsageError("name a topic to copy: TOPIC or --topic TOPIC (repeatable)")
    dst_nsqd, dst_lookupd = split_addresses(to_nsqd), split_addresses(to_lookupd)
    targets = {source: destination or source for source in names}
    for source, target in targets.items():
        validate_topic(target)
        if target == source and not (dst_nsqd or dst_lookupd):
            raise click.UsageError(
                f"--to names the same topic on the same cluster: a loop ({source})"
            )
    json_filter = JsonFilter(require_json_field, require_json_value, whitelist_json_fields)
    if key_header and same_partition:
        raise click.UsageError("choose one of --key-header and --same-partition")
    try:
        idle = parse_duration(idle_timeout) if idle_timeout is not None else None
    except click.BadParameter as exc:
        raise click.UsageError(f"--idle-timeout: {exc.message}") from None
    if idle is None and limit is not None:
        idle = DEFAULT_IDLE
    try:
        give_up = parse_duration(give_up_after) if give_up_after is not None else None
    except click.BadParameter as exc:
        raise click.UsageError(f"--give-up-after: {exc.message}") from None
    client = options.client_options()
    # A message waiting for its copy (or its --rate slot) stays ours, never given up uncopied.
    consumer_extra = never_give_up(
        pass_through("--consumer-opt", consumer_opts, Consumer, RESERVED), "copied"
    )
    if rate is not None:
        # Hold about one second's worth: a message waits for its slot briefly, not for
        # minutes (nsqd's message timeout), and idle time builds no burst.
        max_in_flight = min(max_in_flight, max(1, math.ceil(rate)))
    if limit is not None:
        max_in_flight = min(max_in_flight, limit)  # more would only be requeued
    producer_extra = pass_through("--producer-opt", producer_opts, Producer, _PRODUCER_RESERVED)
    where: dict[str, Any]
    if dst_nsqd or dst_lookupd:
        where = {"nsqd_tcp_addresses": dst_nsqd, "lookupd_http_addresses": dst_lookupd}
    else:
        where = {k: client[k] for k in ("nsqd_tcp_addresses", "lookupd_http_addresses")}
    producer = Producer(
        **where, tls=client["tls"], auth_secret=client["auth_secret"], **producer_extra
    )
    copier = _Copier(producer, targets, options, rate, limit, key_header, same_partition, idle)
    copier.json_filter = json_filter
    if give_up is not None:
        copier.give_up_after = give_up or None

    def make(topic: str) -> Consumer:
        return Consumer(
            topic,
            channel,
            copier.handler(topic),
            max_in_flight=max_in_flight,
            concurrency=max_in_flight,  # each held message waits for its copy's answer
            **client,
            **consumer_extra,
        )

    anyio.run(copier.run, make, names)
    return copier.report()


DEFAULT_IDLE = 10.0
# Copies failing one after another for a while (none copied in between) mean the destination
# is not taking messages: stop, the messages left in the source, rather than retry for ever.
# A time as well as a count: 200 copies in flight fail within a millisecond of an nsqd
# restart that is over in seconds.
MAX_FAILED_IN_A_ROW = 5
DEFAULT_GIVE_UP_AFTER = 60.0


class _Copier:
    def __init__(
        self,
        producer: Producer,
        targets: dict[str, str],
        options: Common,
        rate: float | None,
        limit: int | None,
        key_header: str | None,
        same_partition: bool,
        idle: float | None,
    ) -> None:
        self.producer = producer
        self.targets = targets  # source topic -> destination topic
        self.target = ",".join(dict.fromkeys(targets.values()))  # for messages
        self.source = ",".join(targets)
        self.json_filter = JsonFilter(None, None, ())
        self.options = options
        self.rate = rate
        self.limit = limit
        self.key_header = key_header
        self.same_partition = same_partition
        self.idle = idle  # stop once no message came for this long
        self.verdict = Verdict("to-nsq")
        self.tally = Tally()
        self.taken = 0  # messages given a publish slot (for --limit)
        self.next_slot = 0.0  # when the next --rate slot is free
        self.busy = 0  # handlers running
        self.last_seen = 0.0
        self.failed_in_a_row = 0
        self.failing_since = 0.0  # when the copies began failing in a row
        self.give_up_after: float | None = DEFAULT_GIVE_UP_AFTER
        self.keep_ext = True  # headers and trace ids, until the destination refuses them
        self.runner: TopicRunner | None = None
        self.progress: PubProgress | None = None
        self.last_error = ""
        self.order = KeyOrder()  # copies of one key (or partition) one after another

    async def run(self, make: Callable[[str], Consumer], sources: list[str]) -> None:
        if not await check_reachable(self.options, sources[0], self.verdict):
            return  # a signal during the check
        configure_logging(self.options)
        self.last_seen = anyio.current_time()
        self.runner = TopicRunner("to-nsq", self.options, serving(make), verdict=self.verdict)
        async with anyio.create_task_group() as tg:
            if self.idle is not None:
                tg.start_soon(self._watch_idle, self.runner, self.idle)
            if self.give_up_after is not None:
                tg.start_soon(self._watch_failing, self.give_up_after)
            # Entered out here, outside the runner's cancel scope, so that a stop does not
            # cancel the producer's connections under the handlers still finishing.
            await self.producer.__aenter__()
            try:
                with PubProgress(None) as self.progress:
                    await self.runner.run(sources)
            finally:
                # Every handler has returned: an answer still awaited belongs to a copy
                # that was given up (its message requeued), so closing does not wait for it.
                await self.producer.close(0)
            tg.cancel_scope.cancel()

    async def _watch_idle(self, runner: TopicRunner, idle: float) -> None:
        while True:
            quiet = anyio.current_time() - self.last_seen
            if self.busy == 0 and quiet >= idle:
                break
            await anyio.sleep(max(0.05, idle - quiet) if self.busy == 0 else idle)
        if self.limit is not None and self.tally.published < self.limit:
            why = f"none came for {idle:g}s"
            if self.failed_in_a_row:
                why += f" (the last copy failed: {self.last_error})"
            self.verdict.fail(
                f"copied {self.tally.published} of --limit {self.limit} messages: {why}"
            )
        runner.stop()

    async def _watch_failing(self, after: float) -> None:
        # Failed copies are requeued with a delay: no copy may fail again for a while, so
        # the time is watched here, not only when a copy fails.
        while True:
            await anyio.sleep(min(1.0, after / 4))
            failing_for = anyio.current_time() - self.failing_since
            if self.failed_in_a_row >= MAX_FAILED_IN_A_ROW and failing_for >= after:
                self._give_up(
                    f"{self.failed_in_a_row} copies to {self.target} failed in a row over "
                    f"{failing_for:.0f}s (last: {self.last_error})"
                )
                return

    def _give_up(self, reason: str) -> None:
        self.verdict.fail(
            f"{reason}; copied {self.tally.published} messages, the rest stay in {self.source}"
        )
        if self.runner is not None:
            self.runner.stop()

    def handler(self, topic: str) -> Callable[[Message], Awaitable[None]]:
        """The handler of ``topic``'s consumer."""

        async def handle(message: Message) -> None:
            await self.handle(message, topic)

        return handle

    async def handle(self, message: Message, topic: str) -> None:
        self.busy += 1
        self.last_seen = anyio.current_time()
        try:
            await self._handle(message, topic)
        finally:
            self.busy -= 1
            self.last_seen = anyio.current_time()

    def _stopping(self) -> bool:
        return self.runner is not None and self.runner.stopping.is_set()

    async def _handle(self, message: Message, topic: str) -> None:
        # The place in its key's line is taken before anything waits: in delivery order.
        route = self._route(message)
        if route is None:
            await self._copy(message, topic)
            return
        route = (topic, route)  # each topic's keys in their own lines
        turn = self.order.enter(route)
        try:
            if not await turn.wait_for_previous():
                # The copy before it in its key's line failed: not copied ahead of it.
                turn.failed = True
                if self._stopping() or (self.limit is not None and self.taken >= self.limit):
                    # Not a failure behind it but a stop: back at once, no retry delay.
                    message.requeue(0, backoff=False)
                else:
                    message.requeue()
                return
            turn.failed = not await self._copy(message, topic)
        finally:
            self.order.leave(route, turn)

    def _route(self, message: Message) -> Any:
        """What the copies' order is kept by: the sharding key or the partition (None: no
        order to keep)."""
        if self.key_header is not None:
            key = (_headers(message) or {}).get(self.key_header)
            return ("key", key) if isinstance(key, str | int) else None
        if self.same_partition and message.partition is not None:
            return ("partition", message.partition)
        return None

    async def _copy(self, message: Message, topic: str) -> bool:
        """Copy one message (or give it back); True once the destination acknowledged it
        (or the JSON filters left it out: finished without a copy, as nsq_to_nsq does)."""
        if self._stopping() or (self.limit is not None and self.taken >= self.limit):
            message.requeue(0, backoff=False)  # beyond --limit or stopping: back, untouched
            return False
        body = self.json_filter.apply(message.body)
        if body is None:
            return True
        target = self.targets[topic]
        self.taken += 1
        if self.rate is not None:
            # A slot 1/rate after the previous one, never earlier than now: idle time builds
            # no credit to be spent as a burst.
            now = anyio.current_time()
            due = max(now, self.next_slot)
            self.next_slot = due + 1 / self.rate
            if due > now and self.runner is not None:
                with anyio.move_on_after(due - now):
                    await self.runner.stopping.wait()
            if self._stopping():
                self.taken -= 1
                message.requeue(0, backoff=False)
                return False
        try:
            await self._publish(message, target, body)
        except NSQError as exc:
            # Not copied: back to the channel (with the consumer's backoff), copied later.
            self.tally.failed += 1
            if not self.failed_in_a_row:
                self.failing_since = anyio.current_time()
            self.failed_in_a_row += 1
            self.taken -= 1
            self.last_error = flag_words(str(exc))
            message.requeue()
            if isinstance(exc, TopicNotFound | TopicNotExist):
                self._give_up(f"destination topic {target!r} does not exist: {exc}")
            elif self.tally.failed == 1 or self.options.verbose:
                log.warning("%s: copy failed, message requeued: %s", target, exc)
            return False
        self.failed_in_a_row = 0
        self.tally.published += 1
        if self.progress is not None:
            self.progress.update(self.tally, 0)
        if self.limit is not None and self.tally.published >= self.limit and self.runner:
            self.runner.stop()
        return True

    async def _publish(self, message: Message, target: str, body: bytes) -> None:
        kwargs: dict[str, Any] = {}
        headers = _headers(message)
        if self.key_header is not None:
            key = (headers or {}).get(self.key_header)
            if isinstance(key, str | int) and not isinstance(key, bool):
                kwargs["sharding_key"] = key
        elif self.same_partition and message.partition is not None:
            kwargs["partition"] = message.partition
        if self.keep_ext:
            if headers:
                kwargs["headers"] = headers
            if message.partition is not None and message.trace_id:  # Youzan only
                kwargs["trace_id"] = message.trace_id
        try:
            await self.producer.publish(target, body, **kwargs)
        except (NotSupported, ExtNotSupported) as exc:
            if not (self.keep_ext and ("headers" in kwargs or "trace_id" in kwargs)):
                raise
            # The destination takes no ext headers (classic nsqd, or not an ext topic): copy
            # bodies only from now on, and say so once.
            self.keep_ext = False
            log.warning("%s: headers and trace ids are not kept: %s", target, flag_words(str(exc)))
            kwargs.pop("headers", None)
            kwargs.pop("trace_id", None)
            await self.producer.publish(target, body, **kwargs)

    def report(self) -> int:
        tally, verdict, source = self.tally, self.verdict, self.source
        skipped = self.json_filter.skipped
        if self.options.json:
            print_json(
                {
                    "from": source,  # several topics: comma-separated (as names never hold one)
                    "to": self.target,
                    "published": tally.published,
                    "skipped": skipped,
                    "failed_attempts": tally.failed,
                    "last_error": self.last_error or None,
                    **verdict.fields(),
                }
            )
        elif verdict.error is None and (
            sys.stderr.isatty() or tally.failed or self.options.verbose or verdict.interrupted
        ):
            how = "interrupted: " if verdict.interrupted else ""
            text = f"smartnsq to-nsq: {how}copied {tally.published} messages from {source} to "
            text += self.target
            if skipped:
                text += f"; {skipped} messages left out by the JSON filters"
            if tally.failed:
                text += (
                    f"; {tally.failed} publishes failed and their messages were requeued "
                    f"(last: {self.last_error})"
                )
            print(text, file=sys.stderr)
        return verdict.finish()


def _headers(message: Message) -> dict[str, Any] | None:
    try:
        headers = message.headers
    except NSQError:
        return None  # not JSON: the body is still copied
    return dict(headers) if headers else None
