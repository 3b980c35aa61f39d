"""Toxiproxy, Shopify's fault-injecting TCP proxy, for the fault-injection tests (stdlib only).

``toxiproxy-server`` is built once from its Go module into compat's cache
(``ensure_binaries("toxiproxy")``), started on loopback and driven through its HTTP API::

    with Toxiproxy.start(tmp) as toxi:
        proxy = toxi.proxy("nsqd0", upstream="127.0.0.1:4150")   # listens on a free port
        proxy.silence()          # both directions stop; the sockets stay open
        proxy.heal()             # every toxic removed, the proxy enabled

Faults (each a method of :class:`Proxy`): ``silence`` (timeout toxic with no timeout, both
directions: bytes are swallowed, nothing is closed), ``reset_peer`` (RST on the next byte),
``refuse`` (the proxy disabled: open connections are closed and new ones refused),
``latency`` (+ jitter), ``slicer`` (writes cut into 1-7 byte pieces), ``bandwidth``.

:func:`start_proxied_classic` starts a classic cluster whose nsqd TCP and HTTP ports and
lookupd HTTP ports are each behind a proxy; the nsqd register their proxies' ports with the
lookupds, so a client that discovers them through a lookupd goes through the proxies too.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compat.cluster import Cluster, ClusterError, Daemon
from compat.servers import ensure_binaries
from smartnsq.testing._process import HOST, free_address, wait_until

__all__ = [
    "STREAMS",
    "ProxiedClassic",
    "ProxiedYouzan",
    "Proxy",
    "Toxiproxy",
    "start_proxied_classic",
    "start_proxied_youzan",
]

YOUZAN_LISTEN_HOST = "127.0.0.2"  # the fork's daemons listen here; their proxies on 127.0.0.1

STREAMS = ("upstream", "downstream")  # client -> server, server -> client


class ToxiproxyError(ClusterError):
    """The Toxiproxy API refused a request."""


@dataclass
class Proxy:
    """One proxy: clients connect to :attr:`address`, which forwards to :attr:`upstream`."""

    api: Toxiproxy
    name: str
    address: str
    upstream: str
    _toxics: list[str] = field(default_factory=list)

    # ---- raw API

    def add_toxic(
        self,
        type: str,
        stream: str = "downstream",
        toxicity: float = 1.0,
        name: str | None = None,
        **attributes: Any,
    ) -> str:
        """Add a toxic (``latency``, ``timeout``, ``reset_peer``, ``slicer``, ``bandwidth``,
        ``slow_close``, ``limit_data``); returns its name."""
        if stream not in STREAMS:
            raise ValueError(f"stream must be one of {STREAMS}, not {stream!r}")
        name = name or f"{type}_{stream}_{len(self._toxics)}"
        body = {
            "name": name,
            "type": type,
            "stream": stream,
            "toxicity": toxicity,
            "attributes": attributes,
        }
        self.api.request("POST", f"/proxies/{self.name}/toxics", body)
        self._toxics.append(name)
        return name

    def remove_toxic(self, name: str) -> None:
        self.api.request("DELETE", f"/proxies/{self.name}/toxics/{name}")
        if name in self._toxics:
            self._toxics.remove(name)

    def toxics(self) -> list[dict[str, Any]]:
        return list(self.api.request("GET", f"/proxies/{self.name}/toxics") or [])

    def set_enabled(self, enabled: bool) -> None:
        self.api.request("POST", f"/proxies/{self.name}", {"enabled": enabled})

    # ---- faults

    def _both(self, type: str, **attributes: Any) -> None:
        for stream in STREAMS:
            self.add_toxic(type, stream, **attributes)

    def silence(self) -> None:
        """Both directions stop, sockets stay open (no FIN, no RST): a silent link.

        Bytes sent meanwhile are swallowed, so a connection that lives through it is out of
        step afterwards: a client must give it up (heartbeats) rather than reuse it."""
        self._both("timeout", timeout=0)

    def reset_peer(self, timeout_ms: int = 0) -> None:
        """Connections are reset (RST) on their next byte, either way (after ``timeout_ms``)."""
        self._both("reset_peer", timeout=timeout_ms)

    def refuse(self) -> None:
        """Disable the proxy: open connections are closed, new ones refused."""
        self.set_enabled(False)

    def latency(self, ms: int, jitter_ms: int = 0, streams: Sequence[str] = STREAMS) -> None:
        """Delay every piece of data by ``ms`` (+- ``jitter_ms``) in each of ``streams``."""
        for stream in streams:
            self.add_toxic("latency", stream, latency=ms, jitter=jitter_ms)

    def slicer(self, average: int = 4, variation: int = 3, delay_us: int = 0) -> None:
        """Cut every write into pieces of ``average`` +- ``variation`` bytes, both ways."""
        self._both("slicer", average_size=average, size_variation=variation, delay=delay_us)

    def bandwidth(self, kb_per_s: int) -> None:
        """Cap the throughput at ``kb_per_s`` KB/s each way."""
        self._both("bandwidth", rate=kb_per_s)

    def heal(self) -> None:
        """Remove every toxic and enable the proxy."""
        for toxic in self.toxics():
            self.remove_toxic(str(toxic["name"]))
        self._toxics.clear()
        self.set_enabled(True)


class Toxiproxy:
    """A ``toxiproxy-server`` on loopback; start with :meth:`start`, or use ``with``."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.proxies: dict[str, Proxy] = {}

    @classmethod
    def start(cls, dir: Path | str, timeout: float = 30.0) -> Toxiproxy:
        binary = ensure_binaries("toxiproxy")["toxiproxy-server"]
        root = Path(dir)
        root.mkdir(parents=True, exist_ok=True)
        api = free_address()
        host, port = api.rsplit(":", 1)
        argv = [str(binary), f"-host={host}", f"-port={port}"]
        daemon = Daemon("toxiproxy", "toxiproxy", argv, str(root / "toxiproxy.log"), http=api)
        daemon.spawn()
        self = cls(daemon)
        try:
            wait_until("toxiproxy /version", self._answers, [daemon], timeout)
        except BaseException:
            daemon.terminate()
            raise
        return self

    def _answers(self) -> bool:
        self.request("GET", "/version")
        return True

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"http://{self.daemon.http}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=10.0) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raise ToxiproxyError(f"{method} {path} -> HTTP {e.code}: {e.read()[:300]!r}") from e
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw.decode(errors="replace")

    def proxy(self, name: str, upstream: str, listen: str | None = None) -> Proxy:
        """Create a proxy to ``upstream`` listening on ``listen`` (default: a free port)."""
        body = {"name": name, "listen": listen or f"{HOST}:0", "upstream": upstream}
        info = self.request("POST", "/proxies", {**body, "enabled": True})
        proxy = Proxy(self, name, str(info["listen"]), upstream)
        self.proxies[name] = proxy
        return proxy

    def heal(self) -> None:
        """Every proxy enabled, every toxic removed (``POST /reset``)."""
        self.request("POST", "/reset")
        for proxy in self.proxies.values():
            proxy._toxics.clear()

    def stop(self) -> None:
        self.daemon.terminate()

    def __enter__(self) -> Toxiproxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class ProxiedClassic:
    """A classic cluster whose nsqd (TCP, HTTP) and lookupd (HTTP) are behind proxies."""

    cluster: Cluster
    toxiproxy: Toxiproxy
    nsqd_tcp: list[Proxy]
    nsqd_http: list[Proxy]
    lookupd_http: list[Proxy]

    def nodes(self, i: int) -> list[Proxy]:
        """Both proxies of nsqd ``i``: the whole node's link."""
        return [self.nsqd_tcp[i], self.nsqd_http[i]]

    def stop(self) -> None:
        self.cluster.stop()


def start_proxied_classic(
    toxiproxy: Toxiproxy,
    dir: Path | str,
    nsqd: int = 2,
    lookupd: int = 1,
    nsqd_args: Sequence[str] = (),
    each_nsqd_args: Sequence[Sequence[str]] = (),
) -> ProxiedClassic:
    """Start ``lookupd`` nsqlookupd and ``nsqd`` nsqd, each port a client uses behind its
    own proxy; every nsqd registers its proxies' ports with the lookupds. ``each_nsqd_args[i]``
    is added to nsqd ``i``'s arguments (nodes configured unlike each other)."""
    cluster = Cluster.start("classic", dir=dir, nsqd=0, lookupd=lookupd)
    try:
        tag = Path(dir).name
        lookupd_http = [
            toxiproxy.proxy(f"{tag}-lookupd{i}-http", d.http) for i, d in enumerate(cluster.lookupd)
        ]
        tcp: list[Proxy] = []
        http: list[Proxy] = []

        def advertise(d: Daemon) -> tuple[str, str]:
            tcp.append(toxiproxy.proxy(f"{tag}-{d.name}-tcp", d.tcp))
            http.append(toxiproxy.proxy(f"{tag}-{d.name}-http", d.http))
            return tcp[-1].address, http[-1].address

        for i in range(nsqd):
            own = each_nsqd_args[i] if i < len(each_nsqd_args) else ()
            cluster.add_nsqd([*nsqd_args, *own], advertise=advertise)
    except BaseException:
        cluster.stop()
        raise
    return ProxiedClassic(cluster, toxiproxy, tcp, http, lookupd_http)


@dataclass
class ProxiedYouzan:
    """A Youzan HA cluster whose nsqlookupd and nsqd (TCP, HTTP) are behind proxies: they
    listen on 127.0.0.2 and register 127.0.0.1, where the proxies are. Replication (the
    nsqd's RPC ports) and etcd are not proxied."""

    cluster: Cluster
    toxiproxy: Toxiproxy
    proxies: dict[str, Proxy]

    def nsqd(self, i: int) -> list[Proxy]:
        """The TCP and HTTP proxies of nsqd ``i``: the node's link to its clients."""
        return [self.proxies[f"nsqd{i}-tcp"], self.proxies[f"nsqd{i}-http"]]

    def lookupd(self, i: int) -> list[Proxy]:
        return [self.proxies[f"nsqlookupd{i}-tcp"], self.proxies[f"nsqlookupd{i}-http"]]

    def public(self, address: str) -> str:
        """The 127.0.0.1 address (the proxy) of a daemon's listening ``address``."""
        return f"{HOST}:{address.rsplit(':', 1)[1]}"

    def nsqd_index(self, public_tcp: str) -> int:
        """Which nsqd a client's ``127.0.0.1:PORT`` (as the lookupds name it) is."""
        port = public_tcp.rsplit(":", 1)[1]
        return next(i for i, d in enumerate(self.cluster.nsqd) if d.tcp.endswith(f":{port}"))

    def heal(self) -> None:
        self.toxiproxy.heal()

    def stop(self) -> None:
        self.cluster.stop()


def start_proxied_youzan(
    toxiproxy: Toxiproxy,
    dir: Path | str,
    nsqd: int = 3,
    lookupd: int = 2,
    nsqd_args: Sequence[str] = (),
    lookupd_args: Sequence[str] = (),
) -> ProxiedYouzan:
    """Start a Youzan HA cluster with every client-facing port behind its own proxy."""
    tag = Path(dir).name
    proxies: dict[str, Proxy] = {}

    def expose(name: str, public: str, upstream: str) -> None:
        proxies[name] = toxiproxy.proxy(f"{tag}-{name}", upstream, listen=public)

    cluster = Cluster.start(
        "youzan",
        dir=dir,
        nsqd=nsqd,
        lookupd=lookupd,
        nsqd_args=nsqd_args,
        lookupd_args=lookupd_args,
        listen_host=YOUZAN_LISTEN_HOST,
        expose=expose,
    )
    return ProxiedYouzan(cluster, toxiproxy, proxies)
