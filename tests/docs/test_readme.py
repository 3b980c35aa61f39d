"""The README's links work outside the repository (on PyPI too): files of the repository are
linked by absolute URL under the project's Source URL, and each such link names a real file."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def links(markdown: str) -> list[str]:
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", markdown) if not t.startswith("#")]


def repository_files(targets: list[str], source: str) -> list[str]:
    """The repository paths of the links under ``source``/blob/main/, anchors dropped."""
    base = source.rstrip("/") + "/blob/main/"
    return [t[len(base) :].split("#")[0] for t in targets if t.startswith(base)]


def test_readme_links_work_outside_the_repository() -> None:
    source = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Source"]
    targets = links((ROOT / "README.md").read_text())
    relative = [t for t in targets if "://" not in t]
    assert not relative, f"relative links break on PyPI; link {source}/blob/main/...: {relative}"
    files = repository_files(targets, source)
    assert "docs/index.md" in files and "docs/migrating.md" in files
    missing = [path for path in files if not (ROOT / path).is_file()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_repository_links_are_found() -> None:
    src = "https://x.org/p"
    text = (
        f"[a]({src}/blob/main/docs/a.md) [b](https://y.org/b.md) [c](#here) "
        f"[d]({src}/blob/main/B.md#s)"
    )
    found = repository_files(links(text), src)
    assert found == ["docs/a.md", "B.md"]


def test_trio_backend_is_documented_with_its_extra() -> None:
    # trio is not a dependency: a page that offers backend="trio" says how to install it,
    # and the extra it names exists and installs trio.
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(spec.startswith("trio") for spec in extras.get("trio", [])), extras.get("trio")
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
    offering = [p for p in pages if 'backend="trio"' in p.read_text()]
    assert offering, "no page shows backend='trio' any more: drop this test"
    silent = [str(p.relative_to(ROOT)) for p in offering if "smartnsq[trio]" not in p.read_text()]
    assert not silent, (
        f"pages offering backend='trio' without pip install 'smartnsq[trio]': {silent}"
    )
