"""NSQ's Go utilities' flag spellings (v1.3), so a script or a service unit ports by changing
the command's name: ``nsq_tail --nsqd-tcp-address=127.0.0.1:4150 --topic=t`` runs as
``smartnsq tail --nsqd-tcp-address=127.0.0.1:4150 --topic=t``.

Three kinds of help, all kept here rather than in each command:

* another name for a flag the command has (``--destination-topic`` is ``--to``);
* a value in Go's form where the command's flag takes another (``--interval=2s``,
  ``--rate=0`` for "no limit"), by wrapping that flag's type;
* Go's syntax: ``-flag`` for ``--flag``, and ``--flag=true`` / ``--flag=false`` for a switch.

Go flags that change nothing here (say ``--log-prefix``) are accepted, checked and said so in
their help; docs/cli.md maps every one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import click

from smartnsq import __version__
from smartnsq.cli.options import Common
from smartnsq.cli.words import parse_duration

__all__ = ["go_flags", "normalize"]

# Every command: the cluster's addresses.
_EVERYWHERE = {"--nsqd-tcp-address": "nsqd", "--lookupd-http-address": "lookupd"}

# Per command: Go's flag -> the name of the command's parameter it sets.
_ALIASES: dict[str, dict[str, str]] = {
    "pub": {},  # to_nsq's --topic: see _TOPIC_OPTION
    "tail": {"--n": "count"},
    "to-file": {},
    "to-nsq": {"--destination-topic": "destination", "--destination-nsqd-tcp-address": "to_nsqd"},
    "to-http": {},
    "stat": {"--nsqd-http-address": "nsqd_http"},
}


class _GoDuration(click.ParamType[float, Any]):
    """Seconds, given as Go writes durations (``2s``, ``1m30s``, ``250ms``) or as a number."""

    name = "duration"

    def __init__(self, minimum: float = 0.0) -> None:
        self.minimum = minimum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, float | int):
            seconds = float(value)
        else:
            try:
                seconds = parse_duration(str(value))
            except click.BadParameter as exc:
                self.fail(exc.message, param, ctx)
        if seconds < self.minimum:
            self.fail(f"{value!r} is shorter than {self.minimum:g}s", param, ctx)
        return seconds


class _ZeroIsOff(click.ParamType[Any, Any]):
    """Go's ``0`` for "none" (``--rate=0``, ``--rotate-size=0``): the flag as if not given."""

    def __init__(self, inner: click.ParamType[Any, Any]) -> None:
        self.inner = inner
        self.name = inner.name

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value.strip() in ("0", "0s", "0.0"):
            return None
        return self.inner.convert(value, param, ctx)


# Per command: parameter -> a function giving its type in Go's form, from its own type.
_TYPES: dict[str, dict[str, Callable[[click.ParamType[Any, Any]], click.ParamType[Any, Any]]]] = {
    "pub": {"rate": _ZeroIsOff},
    "to-file": {"rotate_size": _ZeroIsOff, "rotate_interval": _ZeroIsOff},
    "stat": {"interval": lambda _own: _GoDuration(minimum=0.1)},
}


def _set_verbosity(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        options = ctx.ensure_object(Common)
        wanted = {"debug": 2, "info": 1}.get(value.lower(), 0)
        options.verbose = max(options.verbose, wanted)


def _check_duration(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        try:
            parse_duration(value)
        except click.BadParameter as exc:
            raise click.BadParameter(exc.message, ctx, param) from None


def _accepted(name: str, help_text: str, **kwargs: Any) -> click.Option:
    """A Go flag taken for a script's sake: checked, and changing what its help says."""
    # Its own parameter name: never the one of a command's argument (pub's TOPIC).
    key = "go_" + name.lstrip("-").replace("-", "_")
    return click.Option([name, key], expose_value=False, help=help_text, **kwargs)


def _timeouts(what: str) -> list[click.Option]:
    return [
        _accepted(
            f"--http-client-{kind}-timeout",
            f"Accepted for the Go utility's sake: {what}.",
            metavar="DURATION",
            callback=_check_duration,
        )
        for kind in ("connect", "request")
    ]


_LOG_LEVEL = _accepted(
    "--log-level",
    "As nsq_to_file's: debug is -vv, info is -v; warn, error and fatal log warnings only.",
    type=click.Choice(["debug", "info", "warn", "error", "fatal"], case_sensitive=False),
    callback=_set_verbosity,
)
_LOG_PREFIX = _accepted(
    "--log-prefix", "Accepted for nsq_to_file's sake: lines are prefixed 'smartnsq:'."
)

# Go flags with no counterpart, per command.
_EXTRA: dict[str, list[click.Option]] = {
    "to-file": [
        *_timeouts("lookupd is asked with the library's own timeouts"),
        _LOG_LEVEL,
        _LOG_PREFIX,
    ],
    "to-nsq": [
        _accepted(
            "--mode",
            "Accepted for nsq_to_nsq's sake: the producer sends each copy to the healthy nsqd "
            "with the fewest awaiting an answer.",
            type=click.Choice(["round-robin", "hostpool", "epsilon-greedy"]),
        ),
        _accepted(
            "--status-every",
            "Accepted for nsq_to_nsq's sake: a progress bar on a terminal, --json at the end.",
            type=click.IntRange(min=0),
        ),
    ],
    "stat": _timeouts("each request to nsqd and lookupd has 5 s"),
}

# go-nsq's settings that tail and to-file take as flags of their own (nsq_tail and
# nsq_to_file take them through --consumer-opt).
_BUFFER_FLAGS = {
    "output_buffer_timeout": "--output-buffer-timeout",
    "output_buffer_size": "--output-buffer-size",
}

# to_nsq's --topic: pub's TOPIC argument, which it stands for (see normalize).
_TOPIC_OPTION = "--topic"


def _topic_left_over(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:  # normalize() turns it into TOPIC; here only after a '--'
        raise click.UsageError("--topic after '--': give the topic as TOPIC")


def _version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"smartnsq {ctx.info_name} v{__version__}")
        ctx.exit()


def go_flags(command: click.Command) -> click.Command:
    """``command`` taking its Go utility's flag spellings as well as its own."""
    name = command.name or ""
    aliases = {**_EVERYWHERE, **_ALIASES.get(name, {})}
    by_name = {p.name: p for p in command.params}
    taken = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    for flag, target in aliases.items():
        param = by_name.get(target)
        if isinstance(param, click.Option) and flag not in taken:
            param.opts.append(flag)
    for target, wrap in _TYPES.get(name, {}).items():
        param = by_name[target]
        param.type = wrap(param.type)
    for option in _EXTRA.get(name, []):
        command.params.append(option)
    if name == "pub" and _TOPIC_OPTION not in taken:
        command.params.append(
            _accepted(
                _TOPIC_OPTION,
                "The topic, as to_nsq's --topic (same as TOPIC).",
                callback=_topic_left_over,
            )
        )
    if "--version" not in taken:
        command.params.append(
            click.Option(
                ["--version"],
                is_flag=True,
                expose_value=False,
                is_eager=True,
                callback=_version,
                help="Show the version and exit (as the Go utilities' --version).",
            )
        )
    return command


def normalize(group: click.Group, args: Sequence[str]) -> list[str]:
    """``args`` with Go's syntax in click's: ``-flag[=v]`` as ``--flag[=v]``, a switch's
    ``--flag=true`` as ``--flag`` and ``--flag=false`` left out; for ``pub``, to_nsq's
    ``--topic T`` as the TOPIC argument; ``--consumer-opt output_buffer_timeout=25ms`` as
    ``--output-buffer-timeout=25ms`` where the command has that flag."""
    out = list(args)
    for i, arg in enumerate(out):
        command = group.commands.get(arg)
        if command is not None:
            return out[: i + 1] + _normalized(command, out[i + 1 :])
    return out


def _normalized(command: click.Command, args: list[str]) -> list[str]:
    options = {opt: p for p in command.params if isinstance(p, click.Option) for opt in p.opts}
    out: list[str] = []
    topic: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            out += args[i - 1 :]
            break
        if arg.startswith("-") and not arg.startswith("--") and len(arg) > 2:
            flag = "-" + arg.partition("=")[0]
            if flag in options:
                arg = "-" + arg
        flag, eq, value = arg.partition("=")
        param = options.get(flag)
        if eq and isinstance(param, click.Option) and param.is_flag:
            if value.lower() in ("true", "1", "t"):
                out.append(flag)
            elif value.lower() not in ("false", "0", "f"):
                out.append(arg)  # click says what is wrong with it
            continue
        if flag == "--consumer-opt" and set(_BUFFER_FLAGS.values()) <= options.keys():
            pair = value if eq else (args[i] if i < len(args) else "")
            name, _, setting = pair.partition("=")
            own = _BUFFER_FLAGS.get(name.strip().replace("-", "_"))
            if own is not None:  # go-nsq's name for what the command has a flag for
                out += [f"{own}={setting}"]
                i += 0 if eq else 1
                continue
        if command.name == "pub" and flag == _TOPIC_OPTION:
            if eq:
                topic.append(value)
            elif i < len(args):
                topic.append(args[i])
                i += 1
            continue
        out.append(arg)
        takes_value = param is not None and not (param.is_flag or param.count)
        if takes_value and not eq and i < len(args):
            out.append(args[i])  # its value, as it is (even when it starts with '-')
            i += 1
    return topic[-1:] + out if topic else out
