"""Each layer of smartnsq imports only layers below it, and no modules import each other in a
circle. Read from the source (every import, including those inside functions and under
``TYPE_CHECKING``), so an import that runs up fails here, not in a user's process.

The layers, from the ground up (``LAYERS``), as the imports show them:

- ``ground``: what everything may use: the exceptions, the version, argument checks, the
  warning for unlogged problems, and the records the front doors hand out (stats, the
  once-per-kind log policy). They import only ``errors``.
- ``protocol``: the wire, sans-IO; its handshake checks arguments and names the version.
- ``helpers``: sharding and order checks, trace switches (which read topic names through
  ``protocol``).
- ``net``: bytes and waits on anyio, and the blocking connection.
- ``lookup``: nsqlookupd, over ``net``'s HTTP.
- ``producer``: publishing; it knows nothing of consuming.
- ``offsets``: partition offsets and lag, read through ``lookup`` and ``net``.
- ``consumer``: consuming, the delivery (``consumer.message``) included; the dead-letter copy
  publishes through a producer it is given.
- ``front doors``: what users call: the blocking front doors, Spark, the runner, the pytest
  plugin.
- ``adapters``: metrics and tracing around the front doors (``observe``).
- ``package``: ``smartnsq`` itself, which names the front doors.
- ``cli``: the command line, which uses the package's names, and ``python -m smartnsq``.

A package's ``__init__`` sits in its package's layer. ``from smartnsq.x import y`` counts as an
import of ``smartnsq.x.y`` when that is a module, else of ``smartnsq.x``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import smartnsq

PACKAGE = Path(smartnsq.__file__).parent

# From the ground up. A module belongs to the layer naming it or its closest package.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "ground",
        (
            "smartnsq.errors",
            "smartnsq._version",
            "smartnsq._checks",
            "smartnsq.notice",
            "smartnsq.stats",
            "smartnsq.logs",
        ),
    ),
    ("protocol", ("smartnsq.protocol",)),
    ("helpers", ("smartnsq.ordered", "smartnsq.trace")),
    ("net", ("smartnsq.net",)),
    ("lookup", ("smartnsq.lookup",)),
    ("producer", ("smartnsq.producer",)),
    ("offsets", ("smartnsq.offsets", "smartnsq.lag")),
    ("consumer", ("smartnsq.consumer",)),
    ("front doors", ("smartnsq.sync", "smartnsq.spark", "smartnsq.runner", "smartnsq.testing")),
    ("adapters", ("smartnsq.observe",)),
    ("package", ("smartnsq",)),
    ("cli", ("smartnsq.cli", "smartnsq.__main__")),
]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def find_modules(root: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The smartnsq modules ``name`` imports, wherever in the file the import is."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in modules else source)
    return {m for m in found if m == "smartnsq" or m.startswith("smartnsq.")} - {name}


def layer_of(name: str) -> int | None:
    best: tuple[int, int] | None = None  # (length of the matching prefix, layer)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            # "smartnsq" names the package itself, not everything under it.
            under = prefix != "smartnsq" and name.startswith(prefix + ".")
            if (name == prefix or under) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return None if best is None else best[1]


def graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    modules = find_modules(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def unassigned(edges: dict[str, set[str]]) -> list[str]:
    return sorted(name for name in edges if layer_of(name) is None)


def upward(edges: dict[str, set[str]]) -> list[str]:
    found = []
    for name, targets in sorted(edges.items()):
        here = layer_of(name)
        for target in sorted(targets):
            there = layer_of(target)
            if here is not None and there is not None and there > here:
                found.append(
                    f"{name} ({LAYERS[here][0]}) imports {target} ({LAYERS[there][0]}), "
                    "a layer above it"
                )
    return found


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every circle found by a depth-first walk (one per back edge)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        path.append(name)
        for target in sorted(edges.get(name, ())):
            if state.get(target) == 1:
                found.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[name] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name)
    return found


def test_every_module_has_a_layer() -> None:
    missing = unassigned(graph())
    assert not missing, (
        f"no layer for {missing}: add each (or its package) to LAYERS in {__file__}, "
        "in the lowest layer above everything it imports"
    )


def test_no_import_runs_up_a_layer() -> None:
    found = upward(graph())
    assert not found, "move the piece down, or pass it in:\n" + "\n".join(found)


def test_no_import_circles() -> None:
    found = circles(graph())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_graph_is_read() -> None:
    # The checks above would pass on an empty or misread graph.
    edges = graph()
    assert len(edges) > 100
    assert "smartnsq.net.connection" in edges["smartnsq.consumer.intake"]
    assert "smartnsq.net.eager" in edges["smartnsq.net.idle"]  # `from smartnsq.net import eager`
    assert "smartnsq.producer" in edges["smartnsq.consumer.deadletters"]  # under TYPE_CHECKING


def test_an_upward_import_fails(tmp_path: Path) -> None:
    (tmp_path / "smartnsq" / "net").mkdir(parents=True)
    (tmp_path / "smartnsq" / "__init__.py").write_text("")
    (tmp_path / "smartnsq" / "net" / "__init__.py").write_text("")
    (tmp_path / "smartnsq" / "net" / "a.py").write_text(
        "def late():\n    from smartnsq.consumer import Consumer\n"
    )
    (tmp_path / "smartnsq" / "stranger.py").write_text("from smartnsq.net import a\n")
    edges = graph(tmp_path / "smartnsq")
    assert upward(edges) == [
        "smartnsq.net.a (net) imports smartnsq.consumer (consumer), a layer above it"
    ]
    assert unassigned(edges) == ["smartnsq.stranger"]


def test_a_circle_is_found() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(edges) == [["a", "b", "c", "a"]]
