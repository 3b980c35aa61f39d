"""The ``smartnsq`` command group and its error reporting: one line, non-zero exit."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence
from typing import TextIO

import click

from smartnsq import __version__
from smartnsq.cli import pub, stat, tail, to_file, to_http, to_nsq
from smartnsq.cli.goflags import go_flags, normalize
from smartnsq.cli.status import EXIT_FAILED, EXIT_SIGINT, EXIT_USAGE
from smartnsq.cli.words import flag_words
from smartnsq.errors import NSQError

__all__ = ["cli", "run"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="smartnsq")
def cli() -> None:
    """Publish to, read from, archive and inspect NSQ (classic nsqd and Youzan's HA fork).

    Every command takes --lookupd or --nsqd (or NSQ_LOOKUPD / NSQ_NSQD, comma-separated).
    """


for _module in (pub, tail, to_file, to_nsq, to_http, stat):
    cli.add_command(go_flags(_module.command))


def _leaf(exc: BaseException) -> BaseException:
    """The first real exception inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _command_name(argv: Sequence[str]) -> str:
    for arg in argv:
        if arg in cli.commands:
            return f"smartnsq {arg}"
    return "smartnsq"


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return the exit status; errors become one line on stderr."""
    args = normalize(cli, sys.argv[1:] if argv is None else argv)
    name = _command_name(args)
    warnings.showwarning = _show_warning
    try:
        result = cli.main(args=args, prog_name="smartnsq", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help(), err=True)
        return EXIT_USAGE
    except click.UsageError as exc:
        print(f"{name}: error: {_one_line(exc.format_message())} (see --help)", file=sys.stderr)
        return EXIT_USAGE
    except click.ClickException as exc:
        print(f"{name}: error: {_one_line(exc.format_message())}", file=sys.stderr)
        return exc.exit_code
    except click.exceptions.Abort:
        return EXIT_SIGINT
    except BrokenPipeError:
        return _broken_pipe()
    except (KeyboardInterrupt, NSQError, OSError, BaseExceptionGroup) as exc:
        leaf = _leaf(exc)
        if isinstance(leaf, KeyboardInterrupt):
            return EXIT_SIGINT
        if isinstance(leaf, BrokenPipeError):
            return _broken_pipe()
        if not isinstance(leaf, NSQError | OSError | click.ClickException):
            raise
        message = leaf.format_message() if isinstance(leaf, click.ClickException) else leaf
        print(f"{name}: error: {_one_line(flag_words(str(message)))}", file=sys.stderr)
        return EXIT_FAILED
    return result if isinstance(result, int) else 0


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """A warning (plain-text AUTH, say) as one line in the command line's own words."""
    text = _one_line(flag_words(str(message)))
    print(f"smartnsq: warning: {text}", file=file or sys.stderr)


def _broken_pipe() -> int:
    # The reader went away (say, '| head'): stop quietly, and keep Python from complaining
    # about the unflushable stdout at exit.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 0
