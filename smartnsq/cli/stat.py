"""``smartnsq stat [TOPIC]``: the cluster as lookupd and nsqd see it."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import anyio
import click
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from smartnsq.cli.options import CliError, Common, common, common_options, split_addresses
from smartnsq.cli.output import configure_logging, print_json
from smartnsq.cli.statdata import Node, Snapshot, find_nodes, sample, summarize
from smartnsq.cli.status import Verdict
from smartnsq.net.http import HttpClient
from smartnsq.protocol.names import validate_topic

__all__ = ["command", "render"]


@click.command("stat")
@click.argument("topic", required=False)
@click.option("--topic", "topic_flag", help="Only this topic (same as TOPIC, as nsq_stat's).")
@click.option("--channel", help="Only this channel of the topics shown.")
@click.option(
    "--nsqd-http",
    multiple=True,
    envvar="NSQ_NSQD_HTTP",
    metavar="HOST:PORT",
    help="nsqd HTTP address to ask for /stats, besides those lookupd lists (env NSQ_NSQD_HTTP).",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=1.0,
    show_default=True,
    help="Seconds between the two samples that give the rates (and between refreshes).",
)
@click.option("--watch", is_flag=True, help="Refresh until Ctrl-C.")
@click.option(
    "--count",
    type=click.IntRange(min=1),
    help="Show COUNT reports, --interval apart, then exit (implies --watch).",
)
@common_options
def command(
    topic: str | None,
    topic_flag: str | None,
    channel: str | None,
    nsqd_http: tuple[str, ...],
    interval: float,
    watch: bool,
    count: int | None,
) -> int:
    """Show nsqd nodes, topics (on Youzan: partitions, leader, replicas) and channels with
    lag (messages not consumed yet, per partition on Youzan), depth in messages (in memory and
    on disk; on Youzan also in bytes), in-flight and message rates. Only TOPIC when given."""
    options = common()
    if topic and topic_flag and topic != topic_flag:
        raise click.UsageError("give the topic once: TOPIC or --topic")
    topic = topic or topic_flag
    http = split_addresses(nsqd_http)
    if not options.lookupd and not http:
        hint = " (--nsqd is the TCP address; stat needs the HTTP one)" if options.nsqd else ""
        raise CliError(f"stat needs --lookupd or --nsqd-http HOST:HTTP_PORT{hint}")
    if topic is not None:
        validate_topic(topic)
    view = _View(topic, channel, interval, count)
    verdict = Verdict("stat")
    anyio.run(_stat, options, http, view, watch or count is not None, verdict)
    return verdict.finish()


@dataclasses.dataclass
class _View:
    topic: str | None
    channel: str | None
    interval: float
    count: int | None  # reports to show; None: until Ctrl-C (with --watch)


async def _stat(
    options: Common, http: list[str], view: _View, watch: bool, verdict: Verdict
) -> None:
    topic, interval = view.topic, view.interval
    client = HttpClient()
    nodes = await find_nodes(client, options.lookupd, http)
    configure_logging(options)  # after discovery, whose failure is reported as one line
    if not nodes:
        raise CliError("the lookupds know no nsqd")
    first = await sample(client, nodes, topic)
    if len(first.errors) == len(nodes):
        raise CliError("no nsqd answered /stats: " + "; ".join(first.errors.values()))
    if not watch:
        await anyio.sleep(interval)
        snapshot = _checked(nodes, first, await sample(client, nodes, topic), view)
        _show(snapshot, options)
        return
    await _watch(client, options, nodes, first, view, verdict)


def _checked(nodes: list[Node], first: Any, last: Any, view: _View) -> Snapshot:
    snapshot = summarize(nodes, first, last, view.channel)
    if view.topic is not None and not snapshot.topics:
        silent = {**first.errors, **last.errors}
        if silent:
            # The topic may be on the nsqd that did not answer: say which, not "none has it".
            raise CliError(
                f"no nsqd that answered has topic {view.topic!r}; no answer from "
                + "; ".join(f"{http}: {error}" for http, error in silent.items())
            )
        raise CliError(f"no nsqd has topic {view.topic!r}")
    if view.channel is not None and not any(t["channels"] for t in snapshot.topics):
        raise CliError(f"no topic shown has channel {view.channel!r}")
    return snapshot


def _show(snapshot: Snapshot, options: Common) -> None:
    if options.json:
        print_json(dataclasses.asdict(snapshot))
    else:
        _console().print(render(snapshot))


async def _watch(
    client: HttpClient,
    options: Common,
    nodes: list[Node],
    first: Any,
    view: _View,
    verdict: Verdict,
) -> None:
    shown = 0
    async with anyio.create_task_group() as tg:
        tg.start_soon(verdict.watch_signals, tg.cancel_scope.cancel)
        live = None if options.json else Live(console=_console(), auto_refresh=False)
        try:
            if live is not None:
                live.start()
            while view.count is None or shown < view.count:
                await anyio.sleep(view.interval)
                last = await sample(client, nodes, view.topic)
                snapshot = summarize(nodes, first, last, view.channel)
                if live is None:
                    print_json(dataclasses.asdict(snapshot))
                else:
                    live.update(render(snapshot), refresh=True)
                first = last
                shown += 1
            tg.cancel_scope.cancel()
        finally:
            if live is not None:
                live.stop()


def _console() -> Console:
    # Not a terminal (a pipe, a file): wide enough that addresses are not cut short.
    return Console() if sys.stdout.isatty() else Console(width=200)


def _n(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


_TEXT_COLUMNS = ("topic", "partition", "nsqd (leader)", "replicas")


def render(snapshot: Snapshot) -> Group:
    """Three rich tables: nodes, topics (by partition or node), channels."""
    nodes = Table(title="nsqd nodes", title_justify="left")
    for col in ("nsqd", "http", "hostname", "version", "health", "topics"):
        nodes.add_column(col, justify="right" if col == "topics" else "left")
    for n in snapshot.nodes:
        health = n["health"] or f"[red]{n['error'] or 'no answer'}[/red]"
        nodes.add_row(
            n["tcp"] or "-", n["http"], n["hostname"] or "-", n["version"] or "-", health,
            _n(n["topics"]),
        )  # fmt: skip
    rate = f"msg/s ({snapshot.interval:.1f}s)"
    topics = Table(title="topics", title_justify="left")
    for col in ("topic", "partition", "nsqd (leader)", "replicas", "depth", "mem", "disk",
                "bytes", "messages", rate):  # fmt: skip
        topics.add_column(col, justify="left" if col in _TEXT_COLUMNS else "right")
    channels = Table(title="channels", title_justify="left")
    cols = ("topic", "channel", "lag", "by partition", "depth", "mem", "disk", "bytes",
            "in flight", "deferred", "requeued", "timed out", "clients", "messages", rate,
            "egress/s")  # fmt: skip
    for col in cols:
        channels.add_column(col, justify="left" if col in ("topic", "channel") else "right")
    for t in snapshot.topics:
        for p in t.get("partitions") or t.get("nodes") or []:
            replicas = ", ".join(r for r in p["replicas"] if r != p["leader"]) or "-"
            topics.add_row(
                t["topic"], _n(p["partition"]), p["leader"] or "[red]none[/red]", replicas,
                _n(p.get("depth")), _n(p.get("memory_depth")), _n(p.get("disk_depth")),
                _n(p.get("bytes")), _n(p.get("messages")), _n(p.get("rate")),
            )  # fmt: skip
        for c in t["channels"]:
            name = c["channel"] + (" (paused)" if c.get("paused") else "")
            parts = c.get("lag_by_partition") or {}
            by_partition = " ".join(f"{p}:{n}" for p, n in sorted(parts.items())) or "-"
            channels.add_row(
                t["topic"], name, _n(c["lag"]), by_partition, _n(c["depth"]),
                _n(c.get("memory_depth")),
                _n(c.get("disk_depth")), _n(c.get("bytes")), _n(c["in_flight"]),
                _n(c["deferred"]),
                _n(c["requeued"]), _n(c["timed_out"]), _n(c["clients"]), _n(c["messages"]),
                _n(c.get("rate")), _n(c.get("egress_rate")),
            )  # fmt: skip
    return Group(nodes, topics, channels)
