"""``import smartnsq`` stays light: the optional and heavy dependencies load where they are used."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

HEAVY = ("httpx", "snappy", "mmh3", "click", "rich", "pyspark", "pyarrow")


def imported_after(code: str) -> list[str]:
    """The HEAVY modules in ``sys.modules`` of a fresh interpreter after running ``code``."""
    probe = f"{code}; import sys; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    return list(ast.literal_eval(out.stdout))


@pytest.mark.parametrize(
    "code",
    ["import smartnsq", "import smartnsq.sync", "import smartnsq.testing"],
)
def test_import_loads_no_heavy_dependency(code: str) -> None:
    assert imported_after(code) == []


def test_the_probe_sees_a_dependency_once_it_is_used() -> None:
    # the check above would pass for a probe that cannot see anything: show that it can
    assert imported_after("import smartnsq.ordered as o; o.go_partition(b'k', 4)") == ["mmh3"]


def test_a_lookupd_request_loads_no_heavy_dependency() -> None:
    # every Consumer and Producer makes one before its first message (httpx took 30-40 ms)
    code = (
        "import anyio; from smartnsq.net.http import HttpClient, HttpError\n"
        "async def ask():\n"
        "    try: await HttpClient().get('http://127.0.0.1:9/lookup')\n"
        "    except HttpError: pass\n"
        "anyio.run(ask)"
    )
    assert imported_after(code) == []


def test_the_pytest_plugin_loads_neither_anyio_nor_the_client() -> None:
    # pytest loads it in every run wherever smartnsq is installed
    probe = (
        "import pytest, sys; import smartnsq.testing.plugin; "
        "print(sorted(m for m in sys.modules if m == 'anyio' or m.startswith('smartnsq.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert ast.literal_eval(out.stdout) == [
        "smartnsq._version",
        "smartnsq.testing",
        "smartnsq.testing._process",
        "smartnsq.testing.plugin",
    ]


def test_every_public_name_of_the_package_is_there_when_asked_for() -> None:
    import smartnsq
    from smartnsq.consumer import Consumer
    from smartnsq.runner import run

    assert smartnsq.Consumer is Consumer and smartnsq.run is run
    for name in smartnsq.__all__:
        assert getattr(smartnsq, name) is not None
    assert set(smartnsq.__all__) <= set(dir(smartnsq))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        smartnsq.Nope  # noqa: B018
