"""Options every command takes: where the cluster is, TLS, AUTH, output format."""

from __future__ import annotations

import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click
from click.core import ParameterSource

__all__ = ["CliError", "Common", "common_options", "split_addresses"]

F = TypeVar("F", bound=Callable[..., Any])


class CliError(click.ClickException):
    """A problem the user can fix; reported as one line, exit status 1."""


def split_addresses(values: Sequence[str]) -> list[str]:
    """Flatten repeated options and comma-separated lists (as environment variables give)."""
    out: list[str] = []
    for value in values:
        out.extend(part.strip() for part in value.split(",") if part.strip())
    return list(dict.fromkeys(out))


@dataclass
class Common:
    """The connection and output options, shared by every command.

    An address flag on the command line overrides the environment for both kinds: with
    ``--nsqd`` given, ``NSQ_LOOKUPD`` is not used (and the reverse), so a command says where
    to go without the shell's settings changing it behind its back.
    """

    given: dict[str, list[str]] = field(default_factory=dict)  # lookupd / nsqd as parsed
    from_env: set[str] = field(default_factory=set)  # which of them came from the environment
    tls: bool = False
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_insecure: bool = False
    auth_secret: str | None = None
    json: bool = False
    verbose: int = 0

    def _addresses(self, kind: str) -> list[str]:
        on_command_line = any(k not in self.from_env and v for k, v in self.given.items())
        if on_command_line and kind in self.from_env:
            return []
        return self.given.get(kind, [])

    @property
    def lookupd(self) -> list[str]:
        return self._addresses("lookupd")

    @property
    def nsqd(self) -> list[str]:
        return self._addresses("nsqd")

    def require_addresses(self) -> None:
        if not self.lookupd and not self.nsqd:
            raise CliError(
                "say where the cluster is: --lookupd HOST:HTTP_PORT or --nsqd HOST:TCP_PORT "
                "(or NSQ_LOOKUPD / NSQ_NSQD)"
            )

    def tls_setting(self) -> ssl.SSLContext | bool:
        """What to pass as ``tls=`` to Producer and Consumer."""
        wanted = self.tls or self.tls_ca or self.tls_cert or self.tls_insecure
        if not wanted:
            return False
        if self.tls_key and not self.tls_cert:
            raise CliError("--tls-key needs --tls-cert")
        try:
            context = ssl.create_default_context(cafile=self.tls_ca)
            if self.tls_cert:
                context.load_cert_chain(self.tls_cert, self.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise CliError(f"cannot load the TLS files: {exc}") from None
        if self.tls_insecure:
            # For test clusters with self-signed certificates only: no verification at all.
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments shared by :class:`~smartnsq.Producer` and
        :class:`~smartnsq.Consumer`."""
        self.require_addresses()
        return {
            "nsqd_tcp_addresses": self.nsqd,
            "lookupd_http_addresses": self.lookupd,
            "tls": self.tls_setting(),
            "auth_secret": self.auth_secret,
        }


def _store(name: str, convert: Callable[[Any], Any] = lambda v: v) -> Callable[..., None]:
    def callback(ctx: click.Context, _param: click.Parameter, value: Any) -> None:
        setattr(ctx.ensure_object(Common), name, convert(value))

    return callback


def _store_addresses(kind: str) -> Callable[..., None]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        options = ctx.ensure_object(Common)
        options.given[kind] = split_addresses(value)
        if param.name and ctx.get_parameter_source(param.name) is ParameterSource.ENVIRONMENT:
            options.from_env.add(kind)

    return callback


_OPTIONS: list[Callable[[F], F]] = [
    click.option(
        "--lookupd",
        multiple=True,
        envvar="NSQ_LOOKUPD",
        metavar="HOST:PORT",
        expose_value=False,
        callback=_store_addresses("lookupd"),
        help="nsqlookupd HTTP address; repeat or comma-separate (env NSQ_LOOKUPD, not used "
        "when --nsqd is given).",
    ),
    click.option(
        "--nsqd",
        multiple=True,
        envvar="NSQ_NSQD",
        metavar="HOST:PORT",
        expose_value=False,
        callback=_store_addresses("nsqd"),
        help="nsqd TCP address; repeat or comma-separate (env NSQ_NSQD, not used when "
        "--lookupd is given).",
    ),
    click.option(
        "--tls", is_flag=True, expose_value=False, callback=_store("tls"), help="Use TLS."
    ),
    click.option(
        "--tls-ca",
        type=click.Path(exists=True, dir_okay=False),
        expose_value=False,
        callback=_store("tls_ca"),
        help="CA bundle to verify nsqd with (implies --tls).",
    ),
    click.option(
        "--tls-cert",
        type=click.Path(exists=True, dir_okay=False),
        expose_value=False,
        callback=_store("tls_cert"),
        help="Client certificate (PEM; implies --tls).",
    ),
    click.option(
        "--tls-key",
        type=click.Path(exists=True, dir_okay=False),
        expose_value=False,
        callback=_store("tls_key"),
        help="Key of --tls-cert, when not in the same file.",
    ),
    click.option(
        "--tls-insecure",
        is_flag=True,
        expose_value=False,
        callback=_store("tls_insecure"),
        help="TLS without verifying the certificate (test clusters only).",
    ),
    click.option(
        "--auth-secret",
        envvar="NSQ_AUTH_SECRET",
        expose_value=False,
        callback=_store("auth_secret"),
        help="Secret for nsqd's AUTH (env NSQ_AUTH_SECRET).",
    ),
    click.option(
        "--json",
        "json_output",
        is_flag=True,
        expose_value=False,
        callback=_store("json"),
        help="Machine-readable output: JSON, one object per line.",
    ),
    click.option(
        "-v",
        "--verbose",
        count=True,
        expose_value=False,
        callback=_store("verbose"),
        help="Log more (-v: info, -vv: debug) to stderr.",
    ),
]


def common_options(fn: F) -> F:
    """Add the shared options to a command; read them back with ``click.get_current_context``
    or :func:`common`."""
    for option in reversed(_OPTIONS):
        fn = option(fn)
    return fn


def common() -> Common:
    """The shared options of the running command."""
    return click.get_current_context().ensure_object(Common)
