"""The library, the Spark sink included, adds no logging handlers (no Spark session, no servers).

The sink's commit and abort run on the driver side, in a process that configured no
logging: the script below does what they do there, in a fresh interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

SCRIPT = """
import importlib, logging, pkgutil
import smartnsq

for info in pkgutil.walk_packages(smartnsq.__path__, "smartnsq."):
    if not info.name.endswith("__main__"):
        try:
            importlib.import_module(info.name)
        except ImportError:  # an optional extra that is not installed
            pass

from smartnsq.spark.options import Settings
from smartnsq.spark.sink import NsqStreamWriter, NsqWriter, Published

settings = Settings(nsqd=("127.0.0.1:4150",), topic="t")
done = [Published(partition_id=0, retries=1, rows=5, bytes=10, seconds=0.1)]
writer = NsqWriter(settings, ("value",))
writer.commit(done)
writer.abort(done)
stream = NsqStreamWriter(settings, ("value",))
stream.commit(done, 3)
stream.abort(done, 4)

loggers = {"": logging.getLogger()}
loggers.update(
    (name, lg) for name, lg in logging.Logger.manager.loggerDict.items()
    if isinstance(lg, logging.Logger) and name.partition(".")[0] == "smartnsq"
)
for name, lg in sorted(loggers.items()):
    for h in lg.handlers:
        print("HANDLER", name or "root", type(h).__name__)
    if name.startswith("smartnsq") and lg.level != logging.NOTSET:
        print("LEVEL", name, logging.getLevelName(lg.level))
"""


def test_the_library_and_the_spark_sink_add_no_logging_handlers() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    found = [line for line in done.stdout.splitlines() if line.startswith(("HANDLER", "LEVEL"))]
    assert found == ["HANDLER smartnsq NullHandler"]
    # no log lines of the sink's own on stderr ...
    assert "nsq sink: write published" not in done.stderr
    # ... but its warnings are not lost: each kind is given once as a warning
    assert done.stderr.count("UnloggedWarning") == 2, done.stderr
    assert "were run again" in done.stderr and "NSQ cannot take them back" in done.stderr
