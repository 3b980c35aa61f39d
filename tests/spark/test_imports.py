"""No import circles through the Spark modules (no Spark, no servers).

Every import counts, as a reader sees them: module level, inside functions, and under
``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import smartnsq

ROOT = Path(smartnsq.__file__).parent


def module_names() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The smartnsq modules that ``path`` (module ``name``) imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for a in node.names:
                # `from package import module` imports the module
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return {m for m in found if m in known and m != name}


def circles() -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    modules = module_names()
    known = set(modules)
    graph = {name: imports(path, name, known) for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_through_the_spark_modules() -> None:
    spark = [c for c in circles() if any(m.startswith("smartnsq.spark") for m in c)]
    assert spark == []
