"""The connection handshake, sans-IO: what a client sends and decides after connecting.

Both the async :class:`~smartnsq.net.connection.Connection` and the blocking client drive a
:class:`Handshake`: it says what to do next (send bytes, start TLS, switch on compression),
the driver does it and hands back the payload of nsqd's next response frame, until the
handshake is done. Also here: the connection settings (:class:`ConnectionConfig`), what
nsqd agreed to (:class:`Features`) and nsqd addresses.
"""

from __future__ import annotations

import json
import socket
import ssl
import warnings
import zlib
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from smartnsq import _checks
from smartnsq._version import __version__
from smartnsq.errors import (
    ConfigRefused,
    InsecureAuth,
    InsecureAuthWarning,
    InvalidArgument,
    ProtocolError,
    ServerError,
    error_from_frame,
)
from smartnsq.protocol import commands
from smartnsq.protocol.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    FRAME_ERROR,
    FRAME_RESPONSE,
    HEARTBEAT,
)

Codec = Callable[[bytes], bytes]


def parse_address(address: str, default_port: int = 4150) -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port`` too) and check it."""
    if not isinstance(address, str) or not address:
        raise InvalidArgument(f"nsqd address must be a 'host:port' string, not {address!r}")
    _checks.check_no_scheme(address)
    host, sep, port_text = address.rpartition(":")
    if not sep:
        host, port_text = address, str(default_port)
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise InvalidArgument(f"nsqd address {address!r} has a non-numeric port") from None
    if not host or not 0 < port < 65536:
        raise InvalidArgument(f"nsqd address {address!r} is not a valid 'host:port'")
    return host, port


@dataclass(frozen=True, slots=True)
class ConnectionConfig:
    """How to connect and what to negotiate. Times are in seconds.

    Producers and consumers build one from their own arguments (see
    [`Consumer`][smartnsq.Consumer]); build one yourself for
    [`Connection.open`][smartnsq.Connection.open].

    Attributes:
        client_id: Client id reported in IDENTIFY; None: the short host name.
        hostname: Host name reported in IDENTIFY.
        user_agent: User agent reported in IDENTIFY.
        heartbeat_interval: Seconds between nsqd's heartbeats, 1 to 60, or -1 to disable.
        msg_timeout: Seconds nsqd waits for an answer to a message; None: nsqd's default.
        output_buffer_size: Bytes nsqd buffers before writing to this client; None: nsqd's
            default.
        output_buffer_timeout: Seconds nsqd buffers before writing; None: nsqd's default.
        sample_rate: Percentage of messages delivered, 0 to 99 (0: all).
        tls: True (system trust store, host name verified), an ``ssl.SSLContext``, or False.
        tls_hostname: Name the certificate is checked against; None: the address's host.
        snappy: Negotiate Snappy compression.
        deflate: Negotiate DEFLATE compression (not with ``snappy``).
        deflate_level: DEFLATE level, 1 to 9.
        auth_secret: Secret sent with AUTH when nsqd requires it.
        extend_support: Youzan: negotiate ext headers (True/False); None: not sent.
        identify_extra: More IDENTIFY fields, sent as they are.
        connect_timeout: Seconds allowed for the TCP connection.
        handshake_timeout: Seconds allowed for the handshake (IDENTIFY, TLS, AUTH).
        max_frame_size: Largest frame accepted from nsqd, in bytes.
        auth_over_plaintext: False refuses to send ``auth_secret`` without TLS.
        busy_poll: Longest time, in seconds, a request alone in flight polls for its answer
            before the caller sleeps on it (see ``smartnsq.net.busy_poll``); 0 never polls.
            Producers set it from their own ``busy_poll``; consumers leave it 0.

    Raises:
        InvalidArgument: A value out of range, or both ``snappy`` and ``deflate``.
        InvalidType: A value of the wrong type.
    """

    client_id: str | None = None  # default: the short host name
    hostname: str = field(default_factory=socket.gethostname)
    user_agent: str = f"smartnsq/{__version__}"
    heartbeat_interval: float = 30.0
    msg_timeout: float | None = None
    output_buffer_size: int | None = None
    output_buffer_timeout: float | None = None
    sample_rate: int = 0
    tls: ssl.SSLContext | bool = False
    tls_hostname: str | None = None
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 6
    auth_secret: str | bytes | None = field(default=None, repr=False)
    extend_support: bool | None = None  # Youzan: only when the topic is an ext topic
    identify_extra: Mapping[str, Any] = field(default_factory=dict)
    connect_timeout: float = 5.0
    handshake_timeout: float = 5.0
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    # False: refuse to send auth_secret to an nsqd that asks for it without TLS.
    auth_over_plaintext: bool = True
    busy_poll: float = 0.0

    def __post_init__(self) -> None:
        check_config(self)
        if self.snappy and self.deflate:
            raise InvalidArgument("choose either snappy or deflate compression, not both")
        if not 1 <= self.deflate_level <= 9:
            raise InvalidArgument(f"deflate_level must be 1..9, not {self.deflate_level}")
        if not 0 <= self.sample_rate <= 99:
            raise InvalidArgument(f"sample_rate must be 0..99, not {self.sample_rate}")
        if self.heartbeat_interval != -1 and not 1 <= self.heartbeat_interval <= 60:
            raise InvalidArgument(
                "heartbeat_interval must be 1..60 seconds (or -1 to disable), "
                f"not {self.heartbeat_interval}"
            )
        for name in ("connect_timeout", "handshake_timeout"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be > 0")

    def identify_body(self) -> dict[str, Any]:
        """The IDENTIFY command's JSON body for these settings.

        Returns:
            The body as a dict (times in milliseconds, as nsqd expects).
        """
        body: dict[str, Any] = {
            "client_id": self.client_id or socket.gethostname().split(".")[0],
            "hostname": self.hostname,
            "user_agent": self.user_agent,
            "feature_negotiation": True,
            "heartbeat_interval": -1
            if self.heartbeat_interval == -1
            else int(self.heartbeat_interval * 1000),
            "tls_v1": bool(self.tls),
            "snappy": self.snappy,
            "deflate": self.deflate,
            "deflate_level": self.deflate_level,
            "sample_rate": self.sample_rate,
        }
        if self.msg_timeout is not None:
            body["msg_timeout"] = int(self.msg_timeout * 1000)
        # 0 (ours) turns buffering off; nsqd's own 0 would mean "your default", so -1.
        if self.output_buffer_size is not None:
            body["output_buffer_size"] = self.output_buffer_size or -1
        if self.output_buffer_timeout is not None:
            body["output_buffer_timeout"] = round(self.output_buffer_timeout * 1000) or -1
        if self.extend_support is not None:
            body["extend_support"] = self.extend_support
        body.update(self.identify_extra)
        return body


@dataclass(frozen=True, slots=True)
class Features:
    """What the server agreed to in its IDENTIFY reply.

    Attributes:
        version: nsqd's version (the Youzan fork's look like ``0.3.7-HA.1.12.7``).
        max_rdy_count: Highest RDY nsqd accepts on one connection.
        msg_timeout: Seconds nsqd waits for an answer to a message.
        max_msg_timeout: Longest time, in seconds, a message may be held (TOUCH included).
        tls: Whether the connection switched to TLS.
        snappy: Whether the connection switched to Snappy.
        deflate: Whether the connection switched to DEFLATE.
        auth_required: Whether nsqd requires AUTH.
        output_buffer_timeout: Seconds nsqd may hold what it writes to this connection
            before sending it.
        raw: The whole IDENTIFY reply.
    """

    version: str = ""
    max_rdy_count: int = 2500
    msg_timeout: float = 60.0
    max_msg_timeout: float = 900.0
    tls: bool = False
    snappy: bool = False
    deflate: bool = False
    auth_required: bool = False
    output_buffer_timeout: float = 0.25
    raw: Mapping[str, Any] = field(default_factory=dict)

    @property
    def youzan(self) -> bool:
        """The Youzan HA fork reports versions like ``0.3.7-HA.1.12.7``."""
        return "-HA." in self.version

    @classmethod
    def from_reply(cls, reply: object) -> Features:
        """Features from a decoded IDENTIFY reply.

        Args:
            reply: The IDENTIFY reply, decoded from JSON.

        Returns:
            The features, with nsqd's defaults for what the reply leaves out.

        Raises:
            ProtocolError: ``reply`` is not a usable IDENTIFY reply.
        """
        if not isinstance(reply, dict):
            raise ProtocolError(f"IDENTIFY reply is not a JSON object: {reply!r:.100}")
        return cls(
            version=str(reply.get("version", "")),
            max_rdy_count=_reply_int(reply, "max_rdy_count", 2500),
            msg_timeout=_reply_int(reply, "msg_timeout", 60000) / 1000,
            max_msg_timeout=_reply_int(reply, "max_msg_timeout", 900000) / 1000,
            tls=reply.get("tls_v1") is True,
            snappy=reply.get("snappy") is True,
            deflate=reply.get("deflate") is True,
            auth_required=reply.get("auth_required") is True,
            output_buffer_timeout=_reply_int(reply, "output_buffer_timeout", 250, zero=True) / 1000,
            raw=MappingProxyType(dict(reply)),  # read-only: connections share it
        )


# Every connection to one nsqd with the same settings gets the same reply: they share one
# Features (its reply parsed twice held ~1.4 KB; a process with 1,000 consumers keeps 2,000).
_FEATURES: dict[bytes, Features] = {}
_FEATURES_KEPT = 64


def _features(reply: bytes) -> Features:
    features = _FEATURES.get(reply)
    if features is None:
        features = Features.from_reply(_json(reply, "IDENTIFY reply"))
        if len(_FEATURES) < _FEATURES_KEPT:
            _FEATURES[bytes(reply)] = features
    return features


def _reply_int(reply: Mapping[str, Any], name: str, default: int, zero: bool = False) -> int:
    """A positive whole number from nsqd's IDENTIFY reply (absent, or 0 unless ``zero``
    says 0 means something: ``default``)."""
    value = reply.get(name)
    if value is None or (value == 0 and not zero):
        return default
    if type(value) is not int or not (0 if zero else 1) <= value < 2**53:
        raise ProtocolError(f"IDENTIFY reply has an unusable {name}: {value!r:.40}")
    return value


def _json(payload: bytes, what: str) -> Any:
    try:
        return json.loads(payload)
    except (ValueError, RecursionError):  # RecursionError: absurdly nested arrays
        raise ProtocolError(f"{what} is not JSON: {payload[:100]!r}") from None


def _tls_context(tls: ssl.SSLContext | bool) -> ssl.SSLContext:
    if isinstance(tls, ssl.SSLContext):
        return tls
    return ssl.create_default_context()


@dataclass(frozen=True, slots=True)
class Send:
    """Write ``data``, then read nsqd's answer."""

    data: bytes


@dataclass(frozen=True, slots=True)
class StartTLS:
    """Wrap the socket in TLS (nothing else is in flight), then read nsqd's OK."""

    context: ssl.SSLContext
    hostname: str


@dataclass(frozen=True, slots=True)
class StartCompression:
    """From now on compress what is written and decompress what is read; bytes already
    received after the last plain frame are compressed too. Then read nsqd's OK."""

    compress: Codec
    decompress: Codec


Step = Send | StartTLS | StartCompression


class Handshake:
    """Magic, IDENTIFY, then TLS, compression and AUTH as nsqd's reply asks.

    Drive it: perform :meth:`start`'s step, then for every response frame call
    :meth:`reply` and perform the step it returns, until it returns ``None``; then
    :attr:`features` and :attr:`auth` are known. A frame that is a heartbeat gives
    :data:`NOP_NEEDED`: write :data:`commands.NOP` and read the next frame.
    """

    def __init__(self, address: str, host: str, config: ConnectionConfig) -> None:
        self.address = address
        self.host = host
        self.config = config
        self.features = Features()
        self.auth: Mapping[str, Any] | None = None
        self._steps = self._run()

    def start(self) -> Step:
        return next(self._steps)

    def reply(self, ftype: int, payload: bytes) -> Step | bytes | None:
        """The step after nsqd's response frame: a :class:`Step`, ``commands.NOP`` to
        write before reading on (a heartbeat), or ``None`` when the handshake is done."""
        if ftype == FRAME_ERROR:
            raise error_from_frame(payload)
        if ftype != FRAME_RESPONSE:
            raise ProtocolError(f"unexpected frame type {ftype} during handshake")
        if payload == HEARTBEAT:  # possible while AUTH is slow
            return commands.NOP
        try:
            return self._steps.send(payload)
        except StopIteration:
            return None

    def _run(self) -> Generator[Step, bytes, None]:
        cfg = self.config
        reply = yield Send(commands.MAGIC_V2 + commands.identify(cfg.identify_body()))
        if reply == b"OK":  # very old nsqd without feature negotiation
            self.features = Features(version="unknown")
        else:
            self.features = _features(reply)
        f = self.features
        if cfg.tls and not f.tls:
            raise ConfigRefused(
                f"nsqd {self.address} does not offer TLS, which was required (tls=...): "
                "start nsqd with a TLS certificate, or connect without TLS",
                self.address,
            )
        if f.tls:  # nothing follows the IDENTIFY reply until the client starts TLS
            _expect_ok((yield StartTLS(_tls_context(cfg.tls), cfg.tls_hostname or self.host)))
        if f.snappy:
            # imported here, once per connection that negotiates it: `import smartnsq` stays light
            import snappy  # type: ignore[import-untyped]

            comp, decomp = snappy.StreamCompressor(), snappy.StreamDecompressor()
            _expect_ok((yield StartCompression(comp.add_chunk, decomp.decompress)))
        elif f.deflate:
            zc = zlib.compressobj(cfg.deflate_level, zlib.DEFLATED, -15)
            zd = zlib.decompressobj(-15)
            _expect_ok(
                (
                    yield StartCompression(
                        lambda d: zc.compress(d) + zc.flush(zlib.Z_SYNC_FLUSH), zd.decompress
                    )
                )
            )
        if f.auth_required:
            if cfg.auth_secret is None:
                raise ConfigRefused(
                    f"nsqd {self.address} requires AUTH but no auth_secret was set: "
                    "pass auth_secret=",
                    self.address,
                )
            check_plaintext_auth(self.address, cfg, f.tls)
            secret = cfg.auth_secret
            reply = yield Send(
                commands.auth(secret.encode() if isinstance(secret, str) else secret)
            )
            auth = _json(reply, "AUTH reply")
            if not isinstance(auth, dict):
                raise ProtocolError(f"AUTH reply is not a JSON object: {auth!r:.100}")
            self.auth = auth


def _expect_ok(payload: bytes) -> None:
    if payload != b"OK":
        raise ProtocolError(f"expected OK during the handshake, got {payload[:64]!r}")


# -- checks of the settings ----------------------------------------------------------------------

# nsqd's own limits are its settings (--min-output-buffer-timeout 25 ms and
# --max-output-buffer-timeout 30 s by default, --max-output-buffer-size 64 KiB; the Youzan
# fork's maximum is 1 s): outside them it refuses IDENTIFY with E_BAD_BODY, which the consumer
# logs and keeps in last_error. Checked here is what no nsqd accepts: a timeout finer than the
# millisecond IDENTIFY carries, a buffer under 64 bytes.
MIN_OUTPUT_BUFFER_TIMEOUT = 0.001
MIN_OUTPUT_BUFFER_SIZE = 64


def check_output_buffer(size: object, timeout: object) -> None:
    """``output_buffer_size`` (bytes) and ``output_buffer_timeout`` (seconds): None for
    nsqd's default, 0 for no buffering, else what some nsqd can accept."""
    _checks.check_number("output_buffer_size", size, integer=True, min=0, allow_none=True)
    _checks.check_number("output_buffer_timeout", timeout, min=0, allow_none=True)
    if size and size < MIN_OUTPUT_BUFFER_SIZE:  # type: ignore[operator]
        raise InvalidArgument(
            f"output_buffer_size must be 0 (no buffering) or at least {MIN_OUTPUT_BUFFER_SIZE} "
            f"bytes (nsqd's smallest buffer), not {size!r}"
        )
    if timeout and timeout < MIN_OUTPUT_BUFFER_TIMEOUT:  # type: ignore[operator]
        raise InvalidArgument(
            "output_buffer_timeout must be 0 (no buffering) or at least 0.001 seconds "
            f"(IDENTIFY carries milliseconds), not {timeout!r}"
        )


def check_config(c: ConnectionConfig) -> None:
    """Types and ranges of every :class:`~smartnsq.net.connection.ConnectionConfig` field."""
    _checks.check_str("client_id", c.client_id, allow_none=True)
    _checks.check_str("hostname", c.hostname)
    _checks.check_str("user_agent", c.user_agent)
    _checks.check_number("heartbeat_interval", c.heartbeat_interval)
    if c.heartbeat_interval != -1:
        _checks.check_number(
            "heartbeat_interval", c.heartbeat_interval, min=1, max=60, hint=" (or -1 to disable)"
        )
    # nsqd takes a msg_timeout of at least one second (up to its --max-msg-timeout)
    _checks.check_number("msg_timeout", c.msg_timeout, min=1, allow_none=True)
    check_output_buffer(c.output_buffer_size, c.output_buffer_timeout)
    _checks.check_number("sample_rate", c.sample_rate, integer=True, min=0, max=99)
    _checks.check_tls(c.tls)
    _checks.check_str("tls_hostname", c.tls_hostname, allow_none=True)
    _checks.check_bool("snappy", c.snappy)
    _checks.check_bool("deflate", c.deflate)
    _checks.check_number("deflate_level", c.deflate_level, integer=True, min=1, max=9)
    _checks.check_secret(c.auth_secret)
    _checks.check_bool("auth_over_plaintext", c.auth_over_plaintext)
    _checks.check_bool("extend_support", c.extend_support, allow_none=True)
    _checks.check_identify("identify", c.identify_extra)
    _checks.check_timeout("connect_timeout", c.connect_timeout)
    _checks.check_timeout("handshake_timeout", c.handshake_timeout)
    _checks.check_number("max_frame_size", c.max_frame_size, integer=True, min=1)
    # Longer than 10 ms, polling would burn a core's worth of time on every slow answer.
    _checks.check_number(
        "busy_poll", c.busy_poll, min=0, max=0.01, hint=" (seconds; 0 turns polling off)"
    )


# -- settings nsqd refuses ----------------------------------------------------------------------

# What to change, by the error nsqd refused the handshake (or SUB) with.
_REFUSAL_HINTS = {
    "E_BAD_BODY": (
        "a setting is outside this nsqd's limits (output_buffer_timeout: its "
        "--min/--max-output-buffer-timeout; output_buffer_size: --max-output-buffer-size; "
        "heartbeat_interval: --max-heartbeat-interval; msg_timeout: --max-msg-timeout); "
        "change the setting or nsqd's flags"
    ),
    "E_IDENTIFY_FAILED": "nsqd refused IDENTIFY; check the TLS and compression settings",
    "E_AUTH_FAILED": "nsqd's auth server refused auth_secret (or could not be asked)",
    "E_AUTH_DISABLED": "this nsqd has no auth server: leave auth_secret unset",
    "E_AUTH_FIRST": "this nsqd requires AUTH: pass auth_secret=",
    "E_UNAUTHORIZED": "the identity of auth_secret may not use this topic or channel",
}
_INVALID_HINTS = {
    "TLS required": "this nsqd requires TLS: use tls=True (or an ssl.SSLContext)",
    "heartbeats disabled": "nsqd refuses SUB with heartbeat_interval=-1: enable heartbeats",
}


def config_refusal(
    exc: BaseException, address: str, *, handshake: bool = True
) -> ConfigRefused | None:
    """The :class:`ConfigRefused` that ``exc``, raised while opening a connection to
    ``address`` (``handshake``) or by a command on it (SUB, a publish), amounts to; None
    when it is not a refusal of the settings (reconnecting can help, or it is about the
    command itself)."""
    if isinstance(exc, ConfigRefused):
        return exc
    if not isinstance(exc, ServerError):
        return None
    # After the handshake these two are about the command (a publish's body), not settings.
    if not handshake and exc.code in ("E_BAD_BODY", "E_IDENTIFY_FAILED"):
        return None
    hint = _REFUSAL_HINTS.get(exc.code)
    if hint is None and exc.code.startswith("E_AUTH"):
        hint = _REFUSAL_HINTS["E_AUTH_FAILED"]
    if exc.code == "E_INVALID":
        hint = next((h for k, h in _INVALID_HINTS.items() if k in exc.description), None)
    if hint is None:
        return None
    err = ConfigRefused(f"nsqd {address} refuses this client's settings: {exc}; {hint}", address)
    err.__cause__ = exc
    return err


# -- AUTH without TLS --------------------------------------------------------------------------

_warned_plaintext_auth = False


def check_plaintext_auth(address: str, config: ConnectionConfig, tls: bool) -> None:
    """Called right before the AUTH secret is written: refuse or warn when TLS is off."""
    global _warned_plaintext_auth
    if tls:
        return
    if not config.auth_over_plaintext:
        raise InsecureAuth(
            f"nsqd {address} asks for AUTH but the connection is not encrypted and "
            "auth_over_plaintext=False: the secret was not sent; enable TLS (tls=True) "
            "or allow plain-text AUTH",
            address,
        )
    if not _warned_plaintext_auth:
        _warned_plaintext_auth = True
        warnings.warn(
            f"sending the AUTH secret to nsqd {address} without TLS: anyone on the network "
            "path can read it; use tls=True, or auth_over_plaintext=False to refuse",
            InsecureAuthWarning,
            stacklevel=2,
        )
