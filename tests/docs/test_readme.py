"""The README's relative links point at files of the repository (they work on GitHub)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def relative_links(markdown: str) -> list[str]:
    targets = re.findall(r"\]\(([^)\s]+)\)", markdown)
    return [t.split("#")[0] for t in targets if "://" not in t and not t.startswith("#")]


def test_readme_links_resolve() -> None:
    links = relative_links((ROOT / "README.md").read_text())
    assert "docs/index.md" in links and "docs/migrating.md" in links
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_relative_links_are_found() -> None:
    text = "[a](docs/a.md) [b](https://x.org/b.md) [c](#here) [d](BENCH.md#spark)"
    assert relative_links(text) == ["docs/a.md", "BENCH.md"]
