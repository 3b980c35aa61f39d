"""Run the benchmarks: ``python -m bench [publish|consume|youzan|latency|scale|tls_compress|
floor|summarize] [options]``.

Without a sub-command the classic publish and consume benchmarks run, publish first, each
with the given options (only the options both accept: ``--rounds``, ``--quick``,
``--python``, ``--md/--no-md``), then the Youzan, latency (self-paced publishers, then one
clock for all), scale and TLS/compression ones with ``--rounds``/``--quick``/``--md``;
``python -m bench publish ...`` (or ``consume``, ``youzan``, ``latency``, ``scale``,
``tls_compress``, ``floor``) runs one with all of its own options.
"""

from __future__ import annotations

import sys

from bench import consume, floor, latency, publish, scale, summarize, tls_compress, youzan

COMMANDS = {
    "publish": publish.main,
    "consume": consume.main,
    "youzan": youzan.main,
    "latency": latency.main,
    "scale": scale.main,
    "tls_compress": tls_compress.main,
    "floor": floor.main,
    "summarize": summarize.main,
}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in COMMANDS:
        return COMMANDS[args[0]](args[1:])
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    shared = [a for a in args if a.split("=")[0] in ("--rounds", "--quick", "--md", "--no-md")]
    if "--rounds" in args:
        shared.append(args[args.index("--rounds") + 1])
    return (
        publish.main(args)
        or consume.main(args)
        or youzan.main(shared)
        or latency.main(shared)
        or latency.main([*shared, "--feed", "pipe"])
        or scale.main(shared)
        or tls_compress.main(shared)
    )


if __name__ == "__main__":
    raise SystemExit(main())
