"""BENCHMARKS.md opens with its summary table, the table's figures come from the sections below
it, and the figures README.md quotes come from the table.

A `bench` run rewrites its own section, not the summary: these tests catch a summary (or a
README) that quotes a figure no section holds any more.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Every workload the summary has a row for (a row's first cell starts with one of these).
WORKLOADS = (
    "publish,",
    "consume,",
    "blocking publish",
    "ordered Youzan consume",
    "latency p99 at 1,000 msg/s",
    "latency p99 at 10,000 msg/s",
    "scale,",
    "TLS publish",
    "TLS consume",
    "Spark",
)
COLUMNS = ["workload", "smartnsq", "best Python peer", "Go", "ratio", "measured"]
# A figure: 675k, 1.29M, 1,489,646, 0.50, 13.4 (not the digits inside words like "p99").
_FIGURE = re.compile(r"(?<![\w.,])\d[\d,]*(?:\.\d+)?[kM]?(?![\w])")


def sections(markdown: str) -> dict[str, str]:
    parts = re.split(r"^## (.+)$", markdown, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def table(section: str) -> list[list[str]]:
    rows = [line for line in section.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in row.strip().strip("|").split("|")] for row in rows]
    return [r for r in cells if not set("".join(r)) <= set("-: ")]


def figures(text: str) -> set[str]:
    return set(_FIGURE.findall(text))


def benchmarks() -> tuple[str, dict[str, str]]:
    text = (ROOT / "BENCHMARKS.md").read_text()
    return text, sections(text)


def test_the_summary_table_comes_first_with_a_row_per_workload() -> None:
    text, found = benchmarks()
    assert next(iter(found)) == "Summary", list(found)[:3]
    header, *rows = table(found["Summary"])
    assert header == COLUMNS
    assert all(len(row) == len(COLUMNS) and all(row) for row in rows), rows
    missing = [w for w in WORKLOADS if not any(row[0].startswith(w) for row in rows)]
    assert not missing, f"workloads without a summary row: {missing}"
    assert "git" in text.split("## Summary")[0], "the intro says where the history went"


def test_every_summary_figure_is_in_a_section_below() -> None:
    _, found = benchmarks()
    body = "\n".join(text for title, text in found.items() if title != "Summary")
    _, *rows = table(found["Summary"])
    for row in rows:
        # smartnsq, peer and Go cells: each figure must be measured in a section below
        quoted = figures(" ".join(row[1:4]))
        missing = sorted(f for f in quoted if f not in figures(body))
        assert not missing, f"summary row {row[0]!r} quotes {missing}, which no section holds"
        commit = row[5].split(", ")[1].split(" ")[0]
        assert re.fullmatch(r"[0-9a-f]{7}", commit), row[5]
        assert commit in body, f"summary row {row[0]!r}: commit {commit} is in no section"


def test_readme_quotes_figures_from_the_summary_table() -> None:
    _, found = benchmarks()
    summary = figures(found["Summary"])
    fast = sections((ROOT / "README.md").read_text())["How fast"]
    quoted = {f for f in figures(fast) if "," in f or "." in f or f[-1] in "kM"}
    assert len(quoted) >= 5, quoted
    missing = sorted(quoted - summary)
    assert not missing, f"README quotes figures the BENCHMARKS summary does not hold: {missing}"


def test_figures_are_found_whole() -> None:
    assert figures("675k msg/s, 1,489,646 rows, 0.50 % at p99 and 1.29M [1.16M-1.58M]") == {
        "675k",
        "1,489,646",
        "0.50",
        "1.29M",
        "1.16M",
        "1.58M",
    }
