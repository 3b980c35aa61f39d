"""``smartnsq pub TOPIC [FILES...]``: publish lines (or whole files) in batches."""

from __future__ import annotations

import codecs
import logging
import math
import sys

import anyio
import click

from smartnsq import Connection, ConnectionConfig, Producer
from smartnsq.cli.lines import STDIN
from smartnsq.cli.options import CliError, Common, common, common_options
from smartnsq.cli.output import configure_logging, print_json
from smartnsq.cli.publisher import MAX_FAILED_IN_A_ROW, Publisher, Settings, ranges
from smartnsq.cli.status import Verdict
from smartnsq.cli.tally import Tally
from smartnsq.cli.words import parse_duration, pass_through
from smartnsq.errors import NSQError
from smartnsq.protocol.names import validate_topic

__all__ = ["command"]

# Producer keywords the command's own flags set: refused by --producer-opt.
_RESERVED = {
    "nsqd_tcp_addresses": "--nsqd",
    "lookupd_http_addresses": "--lookupd",
    "tls": "--tls",
    "auth_secret": "--auth-secret",
}


def _delimiter(text: str) -> bytes:
    """One byte; backslash escapes such as ``\\t`` and ``\\0`` allowed."""
    try:
        value = codecs.decode(text, "unicode_escape").encode("latin-1")
    except (UnicodeError, ValueError):
        value = b""
    if len(value) != 1:
        raise click.BadParameter(f"{text!r} is not one byte (\\n, \\t, \\0, ',' ...)")
    return value


def _resume(text: str, sources: list[str]) -> tuple[str, int]:
    """``N`` (a line of the first input) or ``SOURCE:N`` as pub reported it."""
    source, _, line = text.rpartition(":")
    labels = ["<stdin>" if s == STDIN else s for s in sources]
    if source in ("", "-"):
        source = labels[0]
    if not line.isdigit() or source not in labels:
        raise click.BadParameter(
            f"{text!r} is not a line number or SOURCE:LINE of the inputs ({', '.join(labels)})"
        )
    return source, int(line)


@click.command("pub")
@click.argument("topic")
@click.argument("files", nargs=-1, type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option("--raw", is_flag=True, help="Publish each file whole, as one message.")
@click.option(
    "--delimiter",
    default="\\n",
    show_default=True,
    help="The byte that ends a message in the input (escapes like \\t, \\0 allowed).",
)
@click.option("--key", help="Sharding key for every message (Youzan partitioned topics).")
@click.option(
    "--key-field",
    metavar="FIELD",
    help="Take each line's sharding key from this field of the line's JSON (a.b for nested).",
)
@click.option("--partition", type=click.IntRange(min=0), help="Publish to this partition.")
@click.option(
    "--delay",
    metavar="DURATION",
    help="Deferred publish (DPUB, classic nsqd): deliver each message after DURATION "
    "(e.g. 500ms, 30s, 5m).",
)
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
@click.option(
    "--resume-from",
    metavar="POSITION",
    help="Skip the input up to POSITION (LINE, or SOURCE:LINE), as an interrupted pub "
    "reported it: every line up to it was acknowledged.",
)
@click.option(
    "--producer-opt",
    "producer_opts",
    multiple=True,
    metavar="NAME=VALUE",
    help="Any other Producer keyword (e.g. snappy=true, max_retries=5, timeout=30s); repeatable.",
)
@common_options
def command(
    topic: str,
    files: tuple[str, ...],
    raw: bool,
    delimiter: str,
    key: str | None,
    key_field: str | None,
    partition: int | None,
    delay: str | None,
    trace: bool,
    rate: float | None,
    batch_size: int,
    resume_from: str | None,
    producer_opts: tuple[str, ...],
) -> int:
    """Publish lines of FILES (or stdin) to TOPIC, one message per line.

    Every line is either acknowledged by nsqd or counted as failed (--json lists them); the
    exit status is 1 if any line was not published. Ctrl-C stops sending at once, waits for
    the answer to the batch in flight and reports the last line up to which nsqd acknowledged
    everything: --resume-from takes it. A progress bar is shown when stderr is a terminal.
    """
    options = common()
    validate_topic(topic)
    if sum(x is not None for x in (key, key_field, partition)) > 1:
        raise click.UsageError("choose one of --key, --key-field and --partition")
    if raw and key_field:
        raise click.UsageError("--key-field reads JSON lines; it cannot be used with --raw")
    try:
        delim = _delimiter(delimiter)
        delay_s = parse_duration(delay) if delay is not None else None
        sources = list(files) or [STDIN]
        resume = _resume(resume_from, sources) if resume_from is not None else None
    except click.BadParameter as exc:
        raise click.UsageError(exc.message) from None
    if delay_s is not None and trace:
        raise click.UsageError("--delay cannot be combined with --trace")
    if rate is not None:
        # Smaller batches keep the pace even: about 20 per second at the capped rate.
        batch_size = min(batch_size, max(1, math.ceil(rate / 20)))
    extra = pass_through("--producer-opt", producer_opts, Producer, _RESERVED)
    settings = Settings(
        topic, sources, raw, key, key_field, True, partition, rate, batch_size, delim,
        delay_s, resume, options.json,
    )  # fmt: skip
    producer = Producer(**options.client_options(), **extra)
    configure_logging(options, quiet=True)
    if trace:
        producer.trace.enable(topic)
        logging.getLogger("smartnsq.trace").setLevel(logging.INFO)
    publishers: list[Publisher] = []
    anyio.run(_publish, producer, settings, options, publishers)
    return _report(publishers[0], options)


async def _publish(
    producer: Producer, settings: Settings, options: Common, out: list[Publisher]
) -> None:
    if (settings.key is not None or settings.key_field) and not options.lookupd:
        settings.use_keys = await _nsqd_has_partitions(options)
    publisher = Publisher(producer, settings, Tally())
    out.append(publisher)
    await producer.__aenter__()
    try:
        await publisher.run()
    finally:
        # Interrupted: what is unanswered is already counted as unknown; closing does not
        # wait for it (a stalled nsqd would hold the exit for seconds).
        await producer.close(0 if publisher.tally.interrupted else 5.0)


async def _nsqd_has_partitions(options: Common) -> bool:
    """Without --lookupd: whether the nsqd is Youzan's (which has partitions) or classic.

    Through --lookupd a sharding key on a classic topic is ignored (it has no partitions);
    with --nsqd alone the same holds. The fork needs its partition count from lookupd.
    """
    config = ConnectionConfig(tls=options.tls_setting(), auth_secret=options.auth_secret)
    for address in options.nsqd:
        try:
            conn = await Connection.open(address, config)
        except NSQError:
            continue
        youzan = conn.features.youzan
        await conn.close()
        if youzan:
            raise CliError(
                f"nsqd {address} is a Youzan nsqd: --key and --key-field pick a partition, "
                "whose count comes from lookupd: give --lookupd"
            )
        return False
    return False  # none reachable: the publish fails and says why


def _report(publisher: Publisher, options: Common) -> int:
    tally, settings = publisher.tally, publisher.settings
    resume = _resume_hint(publisher)
    verdict = _verdict(publisher)
    if options.json:
        print_json(
            {
                "topic": settings.topic,
                "published": tally.published,
                "failed": tally.failed,
                "skipped_empty": tally.skipped,
                "unconfirmed": tally.unconfirmed,
                "interrupted": tally.interrupted,
                "gave_up": tally.gave_up,
                "position": tally.position or None,
                "published_after_position": tally.beyond,
                "resume_from": resume,
                # The same three counts in plain words: acknowledged by nsqd; sent without an
                # answer (may have been stored); read but never sent.
                "acknowledged": tally.published,
                "unknown": tally.unconfirmed,
                "unsent": _unsent(tally),
                **verdict.fields(),
            }
        )
    elif tally.interrupted or tally.failed or tally.gave_up or sys.stderr.isatty():
        print(_summary(publisher, resume), file=sys.stderr)
    return verdict.status


def _verdict(publisher: Publisher) -> Verdict:
    """Failed lines, unanswered ones or giving up make it 1 (the summary says why); a signal
    alone makes it 130 or 143."""
    tally, verdict = publisher.tally, publisher.verdict
    if tally.failed or tally.unconfirmed or tally.gave_up:
        verdict.fail("not every line was published")
    return verdict


def _unsent(tally: Tally) -> int:
    """Lines read from the input but never sent (a stop cut them off)."""
    sent = tally.published + tally.failed + tally.unconfirmed + tally.skipped + tally.resumed
    return max(0, tally.read - sent)


def _resume_hint(publisher: Publisher) -> str | None:
    """The --resume-from value that goes on where this run stopped (None: nothing to skip)."""
    tally = publisher.tally
    if not (tally.interrupted or tally.gave_up or tally.failed) or not tally.position:
        return None
    source, _, line = tally.position.rpartition(":")
    labels = ["<stdin>" if s == STDIN else s for s in publisher.settings.sources]
    return line if source == labels[0] else tally.position


def _summary(publisher: Publisher, resume: str | None) -> str:
    tally, settings = publisher.tally, publisher.settings
    how = "interrupted: " if tally.interrupted else ""
    text = f"smartnsq pub: {how}published {tally.published} messages to {settings.topic}"
    if tally.failed:
        first = publisher.failures[0]
        text += (
            f", {tally.failed} failed (first: {first.source} line "
            f"{ranges(first.lines[:1])}: {first.error}; --json lists them)"
        )
    if tally.unconfirmed:
        text += f", {tally.unconfirmed} sent without an answer (may or may not be published)"
    if _unsent(tally):
        text += f", {_unsent(tally)} read but not sent"
    if tally.skipped:
        text += f", skipped {tally.skipped} empty lines"
    if tally.gave_up:
        text += f"; stopped after {MAX_FAILED_IN_A_ROW} batches failed in a row"
    if tally.interrupted or tally.gave_up or tally.failed:
        if resume is None:
            text += "; nothing acknowledged: run it again from the start"
        else:
            text += f"; acknowledged up to {tally.position}: go on with --resume-from {resume}"
            if tally.beyond:
                text += f" ({tally.beyond} later lines were acknowledged and go out again)"
        if tally.unconfirmed:
            text += f" (the {tally.unconfirmed} without an answer go out again: maybe twice)"
    return text
