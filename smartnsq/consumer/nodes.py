"""Nodes: which nsqd (and partitions) to consume from, one connection loop each.

Discovery asks every lookupd at once and adds or drops connection loops; each loop
connects, subscribes (following what a Youzan nsqd demands: ordered, ext), hands the
connection's reads to intake, and reconnects with backoff. One bad node never stops the rest.

On start, :meth:`Nodes.first_answers` waits for the first outcome: settings an nsqd refuses
(a ``ConfigRefused``) fail the start; a refusal after that is logged as an ERROR (and given
once per process when no logging shows it) while the loop keeps trying.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random

import anyio

from smartnsq.consumer.answers import Answers
from smartnsq.consumer.intake import Intake
from smartnsq.consumer.pacing import Pacing
from smartnsq.consumer.state import State
from smartnsq.consumer.subscription import Subscription, Target
from smartnsq.errors import (
    ConfigRefused,
    ConnectionClosed,
    LookupFailed,
    NSQError,
    ServerError,
    SubExtendForbidden,
    SubExtendNeeded,
    SubOrderRequired,
    TagNotSupported,
)
from smartnsq.logs import OncePerKind
from smartnsq.lookup.model import Node
from smartnsq.lookup.shared import SharedLookup, poll_wait, shared_lookup
from smartnsq.net.connection import Connection
from smartnsq.net.wakeup import Wakeup
from smartnsq.notice import settings_refused, topic_missing
from smartnsq.protocol import commands
from smartnsq.protocol.handshake import config_refusal
from smartnsq.protocol.tags import check_tag_subscription

log = logging.getLogger("smartnsq.consumer")


class Nodes:
    __slots__ = (
        "announced",
        "answers",
        "ext",
        "failures",
        "intake",
        "last_error",
        "lookup_failures",
        "loops",
        "nodes",
        "ordered",
        "pacing",
        "refused",
        "refusing",
        "requery",
        "starting",
        "state",
        "subscribed",
        "tried",
        "wanted",
    )

    def __init__(self, state: State, answers: Answers, pacing: Pacing, intake: Intake) -> None:
        self.state = state
        self.answers = answers
        self.pacing = pacing
        self.intake = intake
        options = state.options
        self.wanted: set[Target] = set()  # (nsqd, partition) we keep a connection loop for
        self.loops: dict[Target, anyio.CancelScope] = {}
        self.failures: dict[Target, int] = {}  # failed connection attempts in a row
        self.subscribed: dict[Target, float] = {}  # when the current subscription began
        self.announced: set[Target] = set()  # "subscribed again" logged in this outage
        self.nodes: dict[Target, Node] = {}  # partition leaders, for the start's HTTP calls
        self.lookup_failures = 0
        self.requery = Wakeup()
        # The subscription mode, following the topic when the options leave it open.
        self.ordered = bool(options.ordered)
        self.ext = bool(options.ext) or options.desired_tag is not None  # tags: ext only
        self.last_error: ServerError | None = None
        # Until first_answers is over: set once the start knows enough (see _settle).
        self.starting: anyio.Event | None = anyio.Event()
        self.tried: set[Target] = set()  # nsqd whose first attempt failed, during the start
        self.refused: ConfigRefused | None = None  # a refusal of the settings, during the start
        self.refusing: set[Target] = set()  # refusal logged as an ERROR, until subscribed again
        if not options.lookupds:
            self.tried.add(_LOOKED_UP)

    async def first_answers(self, limit: float) -> None:
        """Wait until the start knows enough: a subscription worked (the settings are
        accepted), an nsqd refused the settings, or every nsqd known (after the first
        lookup) failed once; at most ``limit`` seconds.

        Raises:
            ConfigRefused: An nsqd refused the settings: reconnecting cannot help.
        """
        starting = self.starting
        if starting is not None:
            with anyio.move_on_after(limit):
                await starting.wait()
        self.starting = None
        self.tried.clear()
        if self.refused is not None:
            raise self.refused

    def _settle(self, done: bool = False) -> None:
        """The start knows enough when ``done`` or every nsqd wanted failed once."""
        starting = self.starting
        if starting is None:
            return
        if done or (_LOOKED_UP in self.tried and self.wanted <= self.tried):
            starting.set()

    def start(self) -> None:
        for address in self.state.options.direct:
            self.want((address, None))
        if self.state.options.lookupds:
            self.state.spawn(self._lookup_loop)

    def cancel(self) -> None:
        for scope in self.loops.values():
            scope.cancel()

    def want(self, target: Target) -> None:
        if target in self.wanted or self.state.tg is None:
            return
        self.wanted.add(target)
        self.state.spawn(self._connection_loop, target)

    def unwant(self, target: Target) -> None:
        self.wanted.discard(target)
        scope = self.loops.pop(target, None)
        if scope is not None:
            scope.cancel()

    async def _connection_loop(self, target: Target) -> None:
        # One WARNING when a connection is lost (or the first attempt fails), DEBUG for the
        # attempts after it, INFO when subscribed again (_connect_and_consume resets it).
        state, options = self.state, self.state.options
        name = target_name(target)
        with anyio.CancelScope() as scope:
            self.loops[target] = scope
            while target in self.wanted and not state.stopping:
                try:
                    await self._connect_and_consume(target)
                    failures = self.failures[target] = 0
                    self.subscribed.pop(target, None)
                    self.announced.discard(target)
                except (
                    SubOrderRequired,
                    SubExtendNeeded,
                    SubExtendForbidden,
                    TagNotSupported,
                ) as exc:
                    failures = self._failed(target, exc)
                    if self._adapt(exc):
                        log.warning("nsqd %s: %s; switching subscription mode", name, exc)
                        self.failures[target] = 0
                        continue
                    self.last_error = exc
                    level = logging.ERROR if failures == 1 else logging.DEBUG
                    log.log(level, "nsqd %s refuses the subscription: %s", name, _explain(exc))
                    if self.starting is not None:
                        self.tried.add(target)
                        self._settle()
                except _Refused as refused:
                    failures = self._failed(target, refused.error)
                    self._refused(target, refused.error)
                except Exception as exc:  # one bad node must not stop the rest
                    failures = self._failed(target, exc)
                    if isinstance(exc, ServerError):
                        self.last_error = exc
                    level = logging.WARNING if failures == 1 else logging.DEBUG
                    expected = isinstance(exc, NSQError | OSError)
                    log.log(
                        level,
                        "nsqd %s: %s; reconnecting (attempt %d; logged once until it recovers)",
                        name,
                        exc if expected else repr(exc),
                        failures,
                        exc_info=None if expected else exc,
                    )
                    if self.starting is not None:
                        self.tried.add(target)
                        self._settle()
                if state.stopping or target not in self.wanted:
                    break
                self.requery.set()  # the lookupd poll, if any, looks again at once
                delay = min(options.reconnect_max, options.reconnect_min * 2 ** min(failures, 16))
                await anyio.sleep(delay * random.uniform(0.5, 1.0))
        if self.loops.get(target) is scope:
            del self.loops[target]
            self.failures.pop(target, None)
            self.subscribed.pop(target, None)
            self.announced.discard(target)
            self.refusing.discard(target)

    def _refused(self, target: Target, err: ConfigRefused) -> None:
        """nsqd refused the settings: fails the start; after it, loud once per outage (an
        nsqd restarted with other limits, say), then the loop keeps trying."""
        cause = err.__cause__
        if isinstance(cause, ServerError):
            self.last_error = cause
        if self.starting is not None:
            self.refused = self.refused or err
            self._settle(done=True)
            return
        if target not in self.refusing:
            self.refusing.add(target)
            log.error("%s; reconnecting (logged once until it recovers)", err)
            settings_refused(log, target[0], err)
        else:
            log.debug("nsqd %s still refuses the settings: %s", target_name(target), err)

    def _failed(self, target: Target, exc: Exception) -> int:
        """Count a failed attempt; returns the failed attempts in a row, this one included.

        A subscription the server ended with an error frame before it lasted
        ``reconnect_max`` (say a FIN refused with the fatal ``E_FAILED_ON_NOT_WRITABLE``
        while a Youzan partition changes leader: SUB is accepted, the node cannot serve
        yet) is one more failed attempt, so the back-off keeps growing and the outage is
        logged once. Any other end of a subscription starts the count again."""
        began = self.subscribed.pop(target, None)
        failures = self.failures.get(target, 0)
        if began is not None:
            lasted = anyio.current_time() - began
            if not (isinstance(exc, ServerError) and lasted < self.state.options.reconnect_max):
                failures = 0
        if failures == 0:
            self.announced.discard(target)  # a new outage
        failures = self.failures[target] = failures + 1
        return failures

    def _adapt(self, exc: ServerError) -> bool:
        """With ``ordered``/``ext`` left to the topic (None), follow what the server demands."""
        options = self.state.options
        if isinstance(exc, SubOrderRequired) and options.ordered is None:
            self.ordered = True
            return True
        if isinstance(exc, SubExtendNeeded | SubExtendForbidden) and options.ext is None:
            self.ext = isinstance(exc, SubExtendNeeded)
            return True
        return False

    async def _connect_and_consume(self, target: Target) -> None:
        state, options = self.state, self.state.options
        address, partition = target
        ordered, ext = self.ordered, self.ext
        config = options.config
        tag = options.desired_tag
        if ext:
            extra = {} if tag is None else {"desired_tag": tag}
            config = dataclasses.replace(config, extend_support=True, identify_extra=extra)
        # SUB_ADVANCED with 4 tokens: a 5th (its own start) would make nsqd ignore the partition.
        advanced = not ordered and options.start_plan.advanced
        try:
            conn = await Connection.open(address, config)
        except Exception as exc:
            refused = config_refusal(exc, address)
            if refused is not None:
                raise _Refused(refused) from exc
            raise
        if tag is not None and not (conn.features.youzan and ext):
            await conn.close(timeout=0)
            check_tag_subscription(options.topic, tag, conn.features.youzan, ext)
        sub = Subscription(
            self.answers, address, conn, partition, ordered=ordered, ext=ext, offsets=advanced
        )
        self.intake.attach(sub, conn)
        once = OncePerKind(log, address)

        def on_async_error(err: ServerError) -> None:
            if not err.fatal:  # a fatal one ends the connection: the loop below logs it once
                once(err)
                self.answers.refused_by_nsqd(err)

        conn.on_async_error = on_async_error
        # This task reads; SUB is sent from a short-lived one beside it. A task (and task
        # group) per connection just to read while subscribing cost 1,000 idle consumers
        # ~10 MB for as long as they ran.
        attempt = _Attempt()
        if not state.spawn(self._subscribe, target, sub, ordered, advanced, attempt):
            await conn.close(timeout=0)  # stopping
        try:
            await conn.run()
        finally:
            if attempt.accepted is not None:  # for _failed: how long the subscription lasted
                self.subscribed[target] = attempt.accepted
            # conn.run() has shut the connection down, however it ended.
            if state.subs.get(target) is sub:
                del state.subs[target]
            self.pacing.redistribute()
        if attempt.refused is not None:
            refused = config_refusal(attempt.refused, address, handshake=False)
            if refused is not None:
                raise _Refused(refused) from attempt.refused
            raise attempt.refused
        reason = conn.close_reason
        if not state.stopping and reason is not None:
            raise reason if isinstance(reason, NSQError) else ConnectionClosed(str(reason))

    async def _subscribe(
        self,
        target: Target,
        sub: Subscription,
        ordered: bool,
        advanced: bool,
        attempt: _Attempt,
    ) -> None:
        """SUB (and a Youzan partition's start position), then the first RDY. A refusal or
        failure goes to ``attempt`` and ends the connection, for its loop to raise."""
        state, options = self.state, self.state.options
        conn, partition, start = sub.conn, target[1], options.start_plan
        subscribe = (
            commands.sub_ordered if ordered else commands.sub_advanced if advanced else commands.sub
        )
        try:
            await conn.request(subscribe(options.topic, options.channel, partition), timeout=10)
            if partition is not None and start.pending(partition):
                # Before any RDY: nothing is delivered from the old position.
                sub.skip = await start.apply(partition, self.nodes[target], ordered)
        except Exception as exc:  # the connection's loop raises it (one bad node, not all)
            attempt.refused = exc
            await conn.close(timeout=0)
            return
        attempt.accepted = anyio.current_time()
        self._settle(done=True)  # the settings are accepted
        self.refusing.discard(target)
        # The count of failed attempts stays until the subscription ends (_failed).
        failed = self.failures.get(target, 0)
        quiet = target in self.announced  # again within one outage: logged once
        if failed:
            self.announced.add(target)
        log.log(
            logging.DEBUG if quiet else logging.INFO,
            "subscribed to %s/%s on nsqd %s%s%s",
            options.topic,
            options.channel,
            target_name(target),
            " (ordered)" if ordered else "",
            f" again after {failed} failed attempts" if failed else "",
        )
        if not conn.usable:  # ended right after SUB's OK: its loop counts the attempt
            return
        state.subs[target] = sub
        if not self.pacing.backoff.level and state.max_in_flight:
            sub.set_rdy(1)  # prove the connection before giving it a full share
        self.pacing.redistribute()

    # -- lookupd ---------------------------------------------------------------------------------

    async def _lookup_loop(self) -> None:
        state, options = self.state, self.state.options
        async with shared_lookup(
            options.lookupds,
            options.topic,
            interval=options.lookupd_poll_interval,
            jitter=options.lookupd_poll_jitter,
        ) as shared:
            last = -math.inf
            failed = 0  # lookups in a row that reached no lookupd
            due: float | None = None  # the shared round this poll is for; None: ask now
            while not state.stopping:
                # Rate limit: re-queries triggered by dropped connections wait at least 1 s.
                await anyio.sleep(max(0.0, last + 1.0 - anyio.current_time()))
                last = anyio.current_time()
                requery = self.requery
                requery.clear()  # a connection lost from here on asks again at once
                failed = 0 if await self._query_lookupds(shared, due) else failed + 1
                if _LOOKED_UP not in self.tried:  # the start knows which nsqd there are
                    self.tried.add(_LOOKED_UP)
                    self._settle()
                if shared.batched:
                    due = shared.due  # one round for every consumer; it backs off itself
                    wait = due - anyio.current_time()
                else:
                    due = None
                    interval, jitter = options.lookupd_poll_interval, options.lookupd_poll_jitter
                    wait = poll_wait(interval, jitter, failed)
                with anyio.move_on_after(wait) as waited:
                    await requery.wait()
                if not waited.cancelled_caught:
                    due = None  # a lost connection: this topic, now

    async def _query_lookupds(self, shared: SharedLookup, due: float | None) -> bool:
        """Ask every lookupd at once; connect to new nsqd, drop those no lookupd lists.
        False when no lookupd answered.

        Whatever goes wrong, the nsqd we have stay connected and the next poll tries again.
        """
        topic = self.state.options.topic
        try:
            await self._apply_lookup(shared, due)
        except LookupFailed as exc:  # every lookupd down: keep what we have
            log.debug("lookup of %s failed: %s", topic, exc)
            return False
        except Exception as exc:  # a bad answer must not stop consuming
            self.lookup_failures += 1
            level = logging.WARNING if self.lookup_failures == 1 else logging.DEBUG
            log.log(level, "lookup of %s failed: %r", topic, exc, exc_info=exc)
        else:
            if self.lookup_failures:
                log.info("lookup of %s works again", topic)
            self.lookup_failures = 0
        return True

    async def _apply_lookup(self, shared: SharedLookup, due: float | None) -> None:
        options = self.state.options
        topic = options.topic
        layout = await (shared.lookup(topic) if due is None else shared.poll(topic, due))
        if layout.meta is not None and layout.meta.partition_num:
            if options.ordered is None:
                self.ordered = layout.meta.ordered
            if options.ext is None:
                self.ext = layout.meta.extend_support
        found: set[Target]
        if layout.partitions:
            wanted = options.start_plan.partitions
            found = set()
            for p, node in layout.partitions.items():
                if wanted is None or p in wanted:
                    found.add((node.tcp_address, p))
                    self.nodes[(node.tcp_address, p)] = node
        else:
            found = {(node.tcp_address, None) for node in layout.producers}
        if not found and not options.direct:
            topic_missing(log, options.topic, options.channel, options.lookupd_poll_interval)
        for target in found:
            self.want(target)
        for target in list(self.wanted):
            if target not in found and target[0] not in options.direct:
                sub = self.state.subs.get(target)
                if not found and target[1] is None and sub is not None and sub.conn.usable:
                    # An answer with no nsqd at all is most likely a lookupd just restarted
                    # that none has registered with yet: working connections stay (as in
                    # go-nsq); one nsqd left out of a list of others (a tombstone) goes.
                    continue
                log.info(
                    "nsqd %s no longer listed for %s; disconnecting",
                    target_name(target),
                    options.topic,
                )
                self.unwant(target)


# In Nodes.tried while the start waits for the first lookup (a target no nsqd has).
_LOOKED_UP: Target = ("", None)


class _Refused(Exception):
    """Carries a ConfigRefused out of one attempt (an ``except ConnectFailed`` elsewhere in
    the loop must not take it for a transient failure)."""

    def __init__(self, error: ConfigRefused) -> None:
        super().__init__(str(error))
        self.error = error


class _Attempt:
    """One connection's subscription, as its SUB task saw it."""

    __slots__ = ("accepted", "refused")

    def __init__(self) -> None:
        self.accepted: float | None = None  # when SUB was answered OK
        self.refused: Exception | None = None  # why SUB (or the start position) failed


def target_name(target: Target) -> str:
    address, partition = target
    return address if partition is None else f"{address} partition {partition}"


def _explain(exc: ServerError) -> str:
    if isinstance(exc, SubOrderRequired):
        return f"{exc}: the topic is ordered; use ordered=True (or leave ordered=None)"
    if isinstance(exc, SubExtendNeeded):
        return f"{exc}: the topic carries ext headers; use ext=True (or leave ext=None)"
    if isinstance(exc, TagNotSupported):
        return str(exc)
    return f"{exc}: the topic has no ext headers; use ext=False (or leave ext=None)"
