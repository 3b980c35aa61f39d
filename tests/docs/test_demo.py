"""`./dev demo` (examples/demo.py) tells the truth about its time: finding the nsqd through
lookupd, consuming, and a deferred message's wait are reported apart, so the time of the first
is never read as the time of the second."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.docs.snippets import ROOT

DEMO_TIMEOUT = 120.0  # seconds; it runs in about 6 s, most of it nsqd's deferred-message scan


@pytest.mark.integration
def test_the_demo_reports_discovery_and_consuming_apart() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    discovery = re.search(r"^discovery: (\d+\.\d+)s from creating the Consumer", out, re.M)
    consuming = re.search(r"^consuming: (\d+) messages in (\d+\.\d+)s from the first", out, re.M)
    deferred = re.search(r"^the deferred message arrived (\d+\.\d+)s .*its 1s delay", out, re.M)
    assert discovery and consuming and deferred, out
    assert int(consuming.group(1)) == 10_001, out  # every message that was not deferred
    assert float(deferred.group(1)) >= 1.0, out  # nsqd held it for its delay at least
    assert "received 10002, finished 10002" in out, out
