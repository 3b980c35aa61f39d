"""``smartnsq to-http TOPIC --post URL``: send each message of a topic to HTTP endpoints
(nsq_to_http). A message is finished only after its request was answered 2xx (by every URL
in ``--mode all``); otherwise it is requeued, with the consumer's backoff, and sent again."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import quote_plus

import anyio
import click

from smartnsq import Consumer, Message
from smartnsq.cli.options import Common, common, common_options
from smartnsq.cli.output import configure_logging, print_json
from smartnsq.cli.reach import check_reachable
from smartnsq.cli.status import Verdict
from smartnsq.cli.tail import RESERVED, topic_list
from smartnsq.cli.topics import TopicRunner, serving
from smartnsq.cli.upstreams import MODES, Upstreams
from smartnsq.cli.words import never_give_up, parse_duration, pass_through
from smartnsq.net.http import HttpClient, HttpError
from smartnsq.protocol.http import build_request

__all__ = ["command"]

DEFAULT_CONTENT_TYPE = "application/octet-stream"
_RESERVED = {**RESERVED, "concurrency": "--n"}


@click.command("to-http")
@click.argument("topics", nargs=-1)
@click.option("--topic", "topic_flags", multiple=True, help="The topic to send (like TOPIC).")
@click.option("--channel", default="nsq_to_http", show_default=True, help="Channel to consume.")
@click.option(
    "--get",
    "get_urls",
    multiple=True,
    metavar="URL",
    help="GET this URL for each message; its one '%s' is replaced by the URL-encoded body "
    "(repeatable).",
)
@click.option(
    "--post",
    "post_urls",
    multiple=True,
    metavar="URL",
    help="POST each message (the body) to this URL (repeatable).",
)
@click.option(
    "--header",
    "headers",
    multiple=True,
    metavar="'NAME: VALUE'",
    help="An extra request header (repeatable).",
)
@click.option(
    "--content-type",
    help=f"Content-Type of the POSTs  [default: {DEFAULT_CONTENT_TYPE}]",
)
@click.option(
    "--mode",
    type=click.Choice(MODES),
    default="hostpool",
    show_default=True,
    help="With several URLs: all (each message to every URL), round-robin, or hostpool "
    "(in turn, leaving failing URLs aside for a while; epsilon-greedy is taken as hostpool).",
)
@click.option(
    "-n",
    "--n",
    "concurrency",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Requests at once.",
)
@click.option(
    "--sample",
    type=click.FloatRange(0.0, 1.0),
    default=1.0,
    show_default=True,
    help="Share of the messages to send (0 to 1); the others are finished unsent.",
)
@click.option(
    "--http-client-connect-timeout",
    "connect_timeout",
    metavar="DURATION",
    default="2s",
    show_default=True,
    help="Longest wait for an HTTP connection.",
)
@click.option(
    "--http-client-request-timeout",
    "request_timeout",
    metavar="DURATION",
    default="20s",
    show_default=True,
    help="Longest wait for a whole request and its answer.",
)
@click.option(
    "--status-every",
    type=click.IntRange(min=0),
    default=250,
    show_default=True,
    help="Say on stderr how it goes every N requests (0: never).",
)
@click.option("--limit", type=click.IntRange(min=1), help="Stop after delivering LIMIT messages.")
@click.option(
    "--max-in-flight",
    type=click.IntRange(min=1),
    default=200,
    show_default=True,
    help="Messages nsqd may send ahead.",
)
@click.option(
    "--consumer-opt",
    "consumer_opts",
    multiple=True,
    metavar="NAME=VALUE",
    help="Any other Consumer keyword (e.g. requeue_delay=5); repeatable.",
)
@common_options
def command(
    topics: tuple[str, ...],
    topic_flags: tuple[str, ...],
    channel: str,
    get_urls: tuple[str, ...],
    post_urls: tuple[str, ...],
    headers: tuple[str, ...],
    content_type: str | None,
    mode: str,
    concurrency: int,
    sample: float,
    connect_timeout: str,
    request_timeout: str,
    status_every: int,
    limit: int | None,
    max_in_flight: int,
    consumer_opts: tuple[str, ...],
) -> int:
    """Send each message of TOPIC to HTTP endpoints (nsq_to_http): GET or POST.

    A message is finished only once its request was answered 2xx (in --mode all, by every
    URL); otherwise it is requeued with the consumer's backoff and sent again later. Runs
    until Ctrl-C or SIGTERM (or --limit): held messages are then requeued.
    """
    options = common()
    names = topic_list(topics, topic_flags)
    if len(names) != 1:
        raise click.UsageError("name one topic: TOPIC or --topic TOPIC")
    if bool(get_urls) == bool(post_urls):
        raise click.UsageError("give --get URL or --post URL (repeatable), not both")
    if content_type is not None and not post_urls:
        raise click.UsageError("--content-type is for --post")
    if content_type == "":
        raise click.UsageError("--content-type needs a value")
    for url in get_urls:
        if url.count("%s") != 1:
            raise click.UsageError(f"--get {url!r}: needs one '%s' (where the body goes)")
    try:
        timeouts = parse_duration(connect_timeout), parse_duration(request_timeout)
    except click.BadParameter as exc:
        raise click.UsageError(exc.message) from None
    sender = _Sender(
        options,
        method="GET" if get_urls else "POST",
        upstreams=Upstreams(get_urls or post_urls, mode),
        headers=_parse_headers(headers, content_type),
        timeouts=timeouts,
        sample=sample,
        limit=limit,
        status_every=status_every,
    )
    for url in get_urls or post_urls:
        try:  # what cannot be sent is refused now, not once per message
            sender.request_for(url, b"x")
        except HttpError as exc:
            raise click.UsageError(f"--{sender.method.lower()} {url!r}: {exc}") from None
    # A message is never finished unsent, nor timed out by a slow endpoint.
    extra = never_give_up(
        pass_through("--consumer-opt", consumer_opts, Consumer, _RESERVED), "sent"
    )
    if limit is not None:
        max_in_flight = min(max_in_flight, limit)  # more would only be requeued
    client = options.client_options()

    def make(topic: str) -> Consumer:
        return Consumer(
            topic,
            channel,
            sender.handle,
            max_in_flight=max_in_flight,
            concurrency=concurrency,
            **client,
            **extra,
        )

    anyio.run(sender.run, make, names[0])
    return sender.report(names[0])


def _parse_headers(pairs: tuple[str, ...], content_type: str | None) -> dict[str, str]:
    """nsq_to_http's ``--header 'Name: value'``; later ones win, as Go's Header.Set."""
    out = {"Content-Type": content_type or DEFAULT_CONTENT_TYPE}  # dropped for GET
    for pair in pairs:
        name, colon, value = pair.partition(":")
        if not colon or not name.strip() or not value.strip():
            raise click.UsageError(f"--header {pair!r}: needs 'NAME: VALUE'")
        if name.strip().lower() in ("host", "content-length", "connection"):
            raise click.UsageError(f"--header {pair!r}: {name.strip()} is set by the request")
        for known in [k for k in out if k.lower() == name.strip().lower()]:
            del out[known]
        out[name.strip()] = value.strip()
    return out


class _Sender:
    """The handler: one request per message (per URL in --mode all), FIN only after 2xx."""

    def __init__(
        self,
        options: Common,
        *,
        method: str,
        upstreams: Upstreams,
        headers: dict[str, str],
        timeouts: tuple[float, float],
        sample: float,
        limit: int | None,
        status_every: int,
    ) -> None:
        self.options = options
        self.method = method
        self.upstreams = upstreams
        self.headers = (
            headers
            if method == "POST"
            else {k: v for k, v in headers.items() if k != "Content-Type"}
        )
        self.client = HttpClient(connect_timeout=timeouts[0])
        self.request_timeout = timeouts[1]
        self.sample = sample
        self.limit = limit
        self.status_every = status_every
        self.delivered = 0
        self.taken = 0  # messages given a --limit slot
        self.requests = 0
        self.failed = 0  # requests that got no 2xx
        self.sampled_out = 0
        self.last_error = ""
        self.verdict = Verdict("to-http")
        self.runner: TopicRunner | None = None

    def request_for(self, url: str, body: bytes) -> tuple[str, bytes | None]:
        """The URL and body of ``body``'s request to ``url`` (checked: HttpError if it
        cannot be sent)."""
        if self.method == "GET":
            target = url.replace("%s", quote_plus(body, safe=""), 1)
            build_request("GET", target, headers=self.headers)
            return target, None
        build_request("POST", url, headers=self.headers, body=body)
        return url, body

    async def run(self, make: Callable[[str], Consumer], topic: str) -> None:
        await check_reachable(self.options, topic)
        configure_logging(self.options)
        self.runner = TopicRunner("to-http", self.options, serving(make), verdict=self.verdict)
        await self.runner.run([topic])

    def _stopping(self) -> bool:
        return self.runner is not None and self.runner.stopping.is_set()

    async def handle(self, message: Message) -> None:
        if self._stopping() or (self.limit is not None and self.taken >= self.limit):
            message.requeue(0, backoff=False)  # beyond --limit or stopping: back, untouched
            return
        if self.sample < 1.0 and random.random() > self.sample:
            self.sampled_out += 1
            return
        self.taken += 1
        urls = self.upstreams.pick()
        results: list[str | None] = [None] * len(urls)

        async def send(i: int) -> None:
            results[i] = await self._send(urls[i], message.body)

        async with anyio.create_task_group() as tg:
            for i in range(len(urls)):
                tg.start_soon(send, i)
        errors = [e for e in results if e is not None]
        if errors:
            self.taken -= 1
            message.requeue()  # with the consumer's delay and backoff: sent again later
            return
        self.delivered += 1
        if self.limit is not None and self.delivered >= self.limit and self.runner is not None:
            self.runner.stop()

    async def _send(self, url: str, body: bytes) -> str | None:
        """None once ``url`` answered 2xx, else why not."""
        target, data = self.request_for(url, body)
        error: str | None = None
        try:
            with anyio.fail_after(self.request_timeout):
                response = await self.client.request(
                    self.method, target, headers=self.headers, body=data
                )
            if not 200 <= response.status < 300:
                error = f"{url}: got status code {response.status}"
        except TimeoutError:
            error = f"{url}: no answer within {self.request_timeout:g}s"
        except HttpError as exc:
            error = f"{url}: {exc}"
        self.upstreams.mark(url, error is None)
        self.requests += 1
        if error is not None:
            self.failed += 1
            self.last_error = error
            if self.failed == 1 or self.options.verbose:
                self._say(f"{error}; the message is requeued")
        if self.status_every and self.requests % self.status_every == 0:
            self._say(self._summary())
        return error

    def _summary(self) -> str:
        text = f"{self.requests} requests, {self.delivered} messages delivered"
        if self.failed:
            text += f", {self.failed} requests failed (last: {self.last_error})"
        return text

    def _say(self, text: str) -> None:
        print(f"smartnsq to-http: {text}", file=sys.stderr, flush=True)

    def report(self, topic: str) -> int:
        if self.options.json:
            summary: dict[str, Any] = {
                "topic": topic,
                "delivered": self.delivered,
                "requests": self.requests,
                "failed_requests": self.failed,
                "sampled_out": self.sampled_out,
                "last_error": self.last_error or None,
                **self.verdict.fields(),
            }
            print_json(summary)
        elif sys.stderr.isatty() or self.failed or self.options.verbose:
            how = "interrupted: " if self.verdict.interrupted else ""
            self._say(how + self._summary())
        return self.verdict.finish()
