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
