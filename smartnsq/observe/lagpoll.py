"""A consumer's lag, asked of nsqd now and then in a thread of its own, so that a metrics
scrape (or the consumer's hot path) never waits on HTTP."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from smartnsq.errors import InvalidArgument, NSQError
from smartnsq.lag import ChannelLag

log = logging.getLogger("smartnsq.observe")

Fetch = Callable[[], list[ChannelLag]]


class LagPoller:
    """Calls ``fetch`` every ``interval`` seconds and keeps the last figure per nsqd and
    partition. A failed poll (or one nsqd's failed answer) keeps the previous figures and is
    logged once, until a poll succeeds again; a channel that no longer exists drops out.
    :meth:`stop` ends the thread."""

    def __init__(self, fetch: Fetch, interval: float, name: str, *, start: bool = True) -> None:
        self._fetch = fetch
        self._interval = interval
        self._lock = threading.Lock()
        self._last: dict[tuple[str, int | None], int] = {}
        self._failing = False
        self._stopped = threading.Event()
        self.polls = 0  # completed polls, failed ones included
        self._thread = threading.Thread(target=self._run, name=f"smartnsq-lag {name}", daemon=True)
        if start:
            self._thread.start()

    def last(self) -> dict[tuple[str, int | None], int]:
        """``(nsqd, partition) -> messages`` from the last poll that answered."""
        with self._lock:
            return dict(self._last)

    def stop(self, wait: float | None = None) -> None:
        """End the polls; with ``wait``, wait that long for the thread to end."""
        self._stopped.set()
        if wait is not None and self._thread.is_alive():
            self._thread.join(wait)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self._stopped.is_set():
            self.poll()
            self._stopped.wait(self._interval)

    def poll(self) -> None:
        try:
            entries = self._fetch()
        except InvalidArgument as exc:  # the set-up, which no later poll mends
            log.warning("consumer lag is not polled: %s", exc)
            self.stop()
        except (NSQError, OSError) as exc:
            if not self._failing:
                log.warning("consumer lag poll failed (the last figures stay): %s", exc)
            self._failing = True
        except Exception:  # a bug must not end the thread silently
            if not self._failing:
                log.exception("consumer lag poll failed (the last figures stay)")
            self._failing = True
        else:
            if self._failing:
                log.info("consumer lag poll answers again")
            self._failing = False
            with self._lock:
                last: dict[tuple[str, int | None], int] = {}
                for e in entries:
                    key = (e.nsqd, e.partition)
                    # An nsqd that failed this time keeps its last figure, as a failed poll does.
                    value = self._last.get(key) if e.error else e.messages
                    if value is not None:
                        last[key] = value
                self._last = last
        self.polls += 1
