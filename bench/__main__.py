"""Run the benchmarks: ``python -m bench [publish|consume|summarize] [options]``.

Without a sub-command both benchmarks run, publish first, each with the given
options (only the options both accept: ``--rounds``, ``--quick``, ``--python``,
``--md/--no-md``); ``python -m bench publish ...`` or ``python -m bench consume
...`` runs one with all of its own options.
"""

from __future__ import annotations

import sys

from bench import consume, publish, summarize

COMMANDS = {"publish": publish.main, "consume": consume.main, "summarize": summarize.main}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in COMMANDS:
        return COMMANDS[args[0]](args[1:])
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    return publish.main(args) or consume.main(args)


if __name__ == "__main__":
    raise SystemExit(main())
