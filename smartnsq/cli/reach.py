"""Checks before consuming: a Consumer retries unreachable servers forever, which suits a
service but not a command that was given a wrong address."""

from __future__ import annotations

import logging

import anyio

from smartnsq.cli.options import CliError, Common
from smartnsq.cli.status import Verdict
from smartnsq.errors import NSQError
from smartnsq.lookup.manager import LookupManager
from smartnsq.protocol.names import validate_topic

__all__ = ["check_reachable"]

log = logging.getLogger("smartnsq.cli")
CONNECT_TIMEOUT = 5.0


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise CliError(f"nsqd address {address!r} must be HOST:PORT")
    return host.strip("[]"), int(port)


async def _can_connect(address: str) -> str | None:
    """None when a TCP connection to ``address`` opens, else why not."""
    host, port = _split(address)
    try:
        with anyio.fail_after(CONNECT_TIMEOUT):
            stream = await anyio.connect_tcp(host, port)
    except TimeoutError:
        return f"no answer within {CONNECT_TIMEOUT:g}s"
    except OSError as exc:
        return exc.strerror or str(exc)
    await stream.aclose()
    return None


async def check_reachable(
    options: Common, topic: str | None, verdict: Verdict | None = None
) -> bool:
    """Fail with one line unless some nsqd connects or some lookupd answers for ``topic``
    (any topic name serves when none is known yet: the answer is what is checked).

    With ``verdict``, a stop signal during the check (a lookupd that does not answer) ends it
    and is recorded there, so that the command still reports: False then.
    """
    if verdict is None:
        await _check(options, topic)
        return True
    async with anyio.create_task_group() as tg:
        tg.start_soon(verdict.watch_signals, tg.cancel_scope.cancel)
        await _check(options, topic)
        tg.cancel_scope.cancel()
    return not verdict.interrupted


async def _check(options: Common, topic: str | None) -> None:
    topic = topic or "smartnsq_reachability_check"
    validate_topic(topic)
    problems: list[str] = []
    for address in options.nsqd:
        why = await _can_connect(address)
        if why is None:
            return
        problems.append(f"nsqd {address}: {why}")
    if options.lookupd:
        try:
            async with LookupManager(options.lookupd) as lookup:
                await lookup.lookup(topic)
            return
        except NSQError as exc:
            problems.append(str(exc))
    raise CliError("cannot reach the cluster: " + "; ".join(problems))
