"""``smartnsq to-nsq TOPIC --to DST``: consume a topic and republish it (nsq_to_nsq), the way
to replay a dead-letter topic. A message is finished only after the destination nsqd
acknowledged its copy: at least once, nothing lost on a crash or a failed publish."""

from __future__ import annotations

import logging
import sys
from typing import Any

import anyio
import click

from smartnsq import Consumer, Message, Producer, serve
from smartnsq.cli.options import Common, common, common_options, split_addresses
from smartnsq.cli.output import configure_logging, print_json
from smartnsq.cli.progress import PubProgress
from smartnsq.cli.reach import check_reachable
from smartnsq.cli.tail import RESERVED, topic_list
from smartnsq.cli.tally import Tally
from smartnsq.cli.topics import TopicRunner
from smartnsq.cli.words import flag_words, pass_through
from smartnsq.errors import ExtNotSupported, NotSupported, NSQError
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
    help="Topic to publish to; default: the same name (then give --to-nsqd or --to-lookupd).",
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
    key_header: str | None,
    same_partition: bool,
    max_in_flight: int,
    consumer_opts: tuple[str, ...],
    producer_opts: tuple[str, ...],
) -> int:
    """Copy the messages of TOPIC to another topic or cluster (nsq_to_nsq).

    Each message is finished only once the destination acknowledged its copy; a failed
    publish requeues it. Youzan ext headers and trace ids are kept where the destination
    takes them. Replays a dead-letter topic: smartnsq to-nsq orders.dead --to orders.
    """
    options = common()
    names = topic_list(topics, topic_flags)
    if len(names) != 1:
        raise click.UsageError("name one topic to copy: TOPIC or --topic TOPIC")
    source = names[0]
    dst_nsqd, dst_lookupd = split_addresses(to_nsqd), split_addresses(to_lookupd)
    target = destination or source
    validate_topic(target)
    if target == source and not (dst_nsqd or dst_lookupd):
        raise click.UsageError("--to names the same topic on the same cluster: a loop")
    if key_header and same_partition:
        raise click.UsageError("choose one of --key-header and --same-partition")
    client = options.client_options()
    consumer_extra = pass_through("--consumer-opt", consumer_opts, Consumer, RESERVED)
    producer_extra = pass_through("--producer-opt", producer_opts, Producer, _PRODUCER_RESERVED)
    where: dict[str, Any]
    if dst_nsqd or dst_lookupd:
        where = {"nsqd_tcp_addresses": dst_nsqd, "lookupd_http_addresses": dst_lookupd}
    else:
        where = {k: client[k] for k in ("nsqd_tcp_addresses", "lookupd_http_addresses")}
    producer = Producer(
        **where, tls=client["tls"], auth_secret=client["auth_secret"], **producer_extra
    )
    copier = _Copier(producer, target, options, rate, limit, key_header, same_partition)
    consumer = Consumer(
        source,
        channel,
        copier.handle,
        max_in_flight=max_in_flight,
        concurrency=max_in_flight,  # each held message waits for its copy's answer
        **client,
        **consumer_extra,
    )
    anyio.run(copier.run, consumer, source)
    return copier.report(source)


class _Copier:
    def __init__(
        self,
        producer: Producer,
        target: str,
        options: Common,
        rate: float | None,
        limit: int | None,
        key_header: str | None,
        same_partition: bool,
    ) -> None:
        self.producer = producer
        self.target = target
        self.options = options
        self.rate = rate
        self.limit = limit
        self.key_header = key_header
        self.same_partition = same_partition
        self.tally = Tally()
        self.taken = 0  # messages given a publish slot (for --rate and --limit)
        self.keep_ext = True  # headers and trace ids, until the destination refuses them
        self.started = 0.0
        self.runner: TopicRunner | None = None
        self.progress: PubProgress | None = None
        self.last_error = ""

    async def run(self, consumer: Consumer, source: str) -> None:
        await check_reachable(self.options, source)
        configure_logging(self.options)
        self.started = anyio.current_time()

        async def copy(topic: str) -> None:
            await serve(consumer, self.producer, signals=())

        self.runner = TopicRunner("to-nsq", self.options, copy)
        with PubProgress(None) as self.progress:
            await self.runner.run([source])

    async def handle(self, message: Message) -> None:
        if self.limit is not None and self.taken >= self.limit:
            message.requeue(0, backoff=False)  # beyond --limit: back, untouched
            return
        slot = self.taken
        self.taken += 1
        if self.rate is not None:
            await anyio.sleep(max(0.0, self.started + slot / self.rate - anyio.current_time()))
        try:
            await self._publish(message)
        except NSQError as exc:
            # Not copied: back to the channel (with the consumer's backoff), copied later.
            self.tally.failed += 1
            self.taken -= 1
            self.last_error = flag_words(str(exc))
            if self.tally.failed == 1 or self.options.verbose:
                log.warning("%s: copy failed, message requeued: %s", self.target, exc)
            message.requeue()
            return
        self.tally.published += 1
        if self.progress is not None:
            self.progress.update(self.tally, 0)
        if self.limit is not None and self.tally.published >= self.limit and self.runner:
            self.runner.stop()

    async def _publish(self, message: Message) -> None:
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
            await self.producer.publish(self.target, message.body, **kwargs)
        except (NotSupported, ExtNotSupported) as exc:
            if not (self.keep_ext and ("headers" in kwargs or "trace_id" in kwargs)):
                raise
            # The destination takes no ext headers (classic nsqd, or not an ext topic): copy
            # bodies only from now on, and say so once.
            self.keep_ext = False
            log.warning(
                "%s: headers and trace ids are not kept: %s", self.target, flag_words(str(exc))
            )
            kwargs.pop("headers", None)
            kwargs.pop("trace_id", None)
            await self.producer.publish(self.target, message.body, **kwargs)

    def report(self, source: str) -> int:
        tally = self.tally
        if self.options.json:
            print_json(
                {
                    "from": source,
                    "to": self.target,
                    "published": tally.published,
                    "failed_attempts": tally.failed,
                    "last_error": self.last_error or None,
                }
            )
        elif sys.stderr.isatty() or tally.failed or self.options.verbose:
            text = f"smartnsq to-nsq: copied {tally.published} messages from {source} to "
            text += self.target
            if tally.failed:
                text += (
                    f"; {tally.failed} publishes failed and their messages were requeued "
                    f"(last: {self.last_error})"
                )
            print(text, file=sys.stderr)
        return 0


def _headers(message: Message) -> dict[str, Any] | None:
    try:
        headers = message.headers
    except NSQError:
        return None  # not JSON: the body is still copied
    return dict(headers) if headers else None
