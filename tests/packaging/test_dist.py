"""The sdist and the wheel hold exactly what they should.

The sdist is what builds the wheel plus README, CHANGELOG and LICENSE; the test suite,
``compat/``, ``bench/`` and ``examples/`` stay in the repository (see MANIFEST.in). The wheel
is the package (with ``py.typed``), the top-level ``pyspark_smartnsq`` module that Spark
discovers, the licence and the entry points. Expectations come from the files git knows.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SDIST_EXTRAS = {
    "CHANGELOG.md",
    "LICENSE",
    "MANIFEST.in",
    "README.md",
    "pyproject.toml",
    "pyspark_smartnsq.py",
}
# written by setuptools into every sdist
SDIST_GENERATED = {"PKG-INFO", "setup.cfg"}


def project_files() -> set[str]:
    """Files git tracks, or would track (untracked but not ignored), that exist."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {f for f in out.splitlines() if (ROOT / f).is_file()}


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The sdist, and the wheel built from that sdist (so the sdist must be complete)."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        check=True,
        timeout=300,
    )
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return sdist, wheel


def test_sdist_holds_the_package_and_its_documents_and_no_tests(
    dists: tuple[Path, Path],
) -> None:
    sdist, _ = dists
    with tarfile.open(sdist) as tar:
        names = {m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()}
    ours = {n for n in names if n not in SDIST_GENERATED and not n.startswith("smartnsq.egg-info/")}
    expected = {f for f in project_files() if f.startswith("smartnsq/")} | SDIST_EXTRAS
    assert ours == expected
    assert not any(n.startswith(("tests/", "compat/", "bench/", "examples/")) for n in names)


def test_wheel_holds_the_package_py_typed_and_the_spark_module(dists: tuple[Path, Path]) -> None:
    _, wheel = dists
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        (dist_info,) = {n.split("/", 1)[0] for n in names if ".dist-info/" in n}
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
        metadata = zf.read(f"{dist_info}/METADATA").decode()
    code = {n for n in names if not n.startswith(dist_info)}
    expected = {f for f in project_files() if f.startswith("smartnsq/")} | {"pyspark_smartnsq.py"}
    assert code == expected
    assert {"smartnsq/py.typed", "smartnsq/testing/plugin.py", "pyspark_smartnsq.py"} <= code
    assert f"{dist_info}/licenses/LICENSE" in names
    assert "License-Expression: MIT" in metadata.splitlines()
    assert "[pytest11]\nsmartnsq = smartnsq.testing.plugin" in entry_points
    assert "[console_scripts]\nsmartnsq = smartnsq.cli:main" in entry_points
