"""The command line's modules import each other without circles (TYPE_CHECKING included)."""

from __future__ import annotations

import ast
from pathlib import Path

import smartnsq.cli

PACKAGE = Path(smartnsq.cli.__file__).parent


def _imports(path: Path) -> set[str]:
    """The smartnsq.cli modules ``path`` imports, wherever the import statement is."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "smartnsq.cli":
                out.update(f"smartnsq.cli.{a.name}" for a in node.names)
            elif node.module.startswith("smartnsq.cli."):
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("smartnsq.cli."))
    return out


def test_no_import_circles_in_the_cli_package():
    graph = {f"smartnsq.cli.{p.stem}": _imports(p) for p in PACKAGE.glob("*.py")}
    graph["smartnsq.cli"] = graph.pop("smartnsq.cli.__init__")

    def visit(module: str, path: list[str]) -> None:
        for dep in sorted(graph.get(module, ())):
            assert dep not in path, "import circle: " + " -> ".join([*path, dep])
            visit(dep, [*path, dep])

    for module in graph:
        visit(module, [module])
