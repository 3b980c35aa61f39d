"""Which URLs of ``smartnsq to-http`` get a message: nsq_to_http's ``--mode``.

``all``: every URL (the message is done once each answered 2xx); ``round-robin``: the next URL
in turn; ``hostpool`` (nsq_to_http's default, and its ``epsilon-greedy``): the next URL in
turn among those not failing, as go-hostpool's pool does: a URL that failed is left out for
30 s, then tried once more, the wait doubling up to 15 minutes while it keeps failing; when
every URL is failing, all are tried again at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["MODES", "Upstreams"]

MODES = ("hostpool", "round-robin", "epsilon-greedy", "all")
RETRY_FIRST = 30.0  # go-hostpool's initial retry delay
RETRY_MAX = 900.0  # and its cap


@dataclass
class _Host:
    url: str
    dead: bool = False
    retry_at: float = 0.0
    retry_delay: float = RETRY_FIRST


class Upstreams:
    """The URLs and the ``mode`` that chooses among them."""

    def __init__(
        self, urls: Sequence[str], mode: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}")
        self.mode = "hostpool" if mode == "epsilon-greedy" else mode
        self.hosts = [_Host(url) for url in urls]
        self.clock = clock
        self._next = 0

    def pick(self) -> list[str]:
        """The URLs the next message goes to."""
        if self.mode == "all":
            return [h.url for h in self.hosts]
        if self.mode == "round-robin":
            host = self.hosts[self._next % len(self.hosts)]
            self._next += 1
            return [host.url]
        return [self._pool_pick()]

    def _pool_pick(self) -> str:
        now = self.clock()
        if all(h.dead and h.retry_at > now for h in self.hosts):
            for h in self.hosts:  # all failing: try them all again rather than none
                h.dead = False
        count = len(self.hosts)
        for i in range(count):
            host = self.hosts[(self._next + i) % count]
            if not host.dead or host.retry_at <= now:
                self._next += i + 1
                if host.dead:
                    host.retry_at = now + host.retry_delay  # one retry per delay
                return host.url
        raise AssertionError("unreachable: some host is alive after the reset")

    def mark(self, url: str, ok: bool) -> None:
        """What became of a request to ``url`` (hostpool keeps failing URLs aside)."""
        if self.mode != "hostpool":
            return
        for host in self.hosts:
            if host.url != url:
                continue
            if ok:
                host.dead, host.retry_delay = False, RETRY_FIRST
            elif not host.dead:
                host.dead, host.retry_delay = True, RETRY_FIRST
                host.retry_at = self.clock() + host.retry_delay
            else:
                host.retry_delay = min(host.retry_delay * 2, RETRY_MAX)
                host.retry_at = self.clock() + host.retry_delay
