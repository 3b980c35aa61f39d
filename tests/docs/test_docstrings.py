"""Every public callable, and each of its parameters, is documented.

The public API is what ``__all__`` lists in ``smartnsq``, ``smartnsq.sync``,
``smartnsq.trace`` and ``smartnsq.errors``. A callable needs a docstring of its own; each of
its parameters must be named in an ``Args:`` section (Google style; ``Attributes:`` counts
for the fields of a dataclass) of its docstring, or, for a class, of the class docstring or
its ``__init__``'s. Public methods and properties of public classes follow the same rules.
A new parameter without documentation fails here.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import smartnsq
import smartnsq.errors
import smartnsq.sync
import smartnsq.trace

MODULES = (smartnsq, smartnsq.sync, smartnsq.trace, smartnsq.errors)
SECTIONS = ("Args", "Arguments", "Parameters", "Keyword Args", "Attributes")
_SECTION = re.compile(r"^(\s*)([A-Z][A-Za-z ]*):\s*$")
_ENTRY = re.compile(r"^(\*{0,2}\w+)(\s*\([^)]*\))?\s*:")


def documented_names(doc: str | None) -> set[str]:
    """The names listed in the Args-like sections of a Google-style docstring."""
    names: set[str] = set()
    if not doc:
        return names
    lines = inspect.cleandoc(doc).splitlines()
    section_indent: int | None = None
    entry_indent: int | None = None
    for line in lines:
        header = _SECTION.match(line)
        if header is not None:
            in_args = header.group(2) in SECTIONS
            section_indent = len(header.group(1)) if in_args else None
            entry_indent = None
            continue
        if section_indent is None or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent <= section_indent:
            section_indent = None  # the section ended
            continue
        if entry_indent is None:
            entry_indent = indent
        if indent == entry_indent:
            entry = _ENTRY.match(line.strip())
            if entry is not None:
                names.add(entry.group(1).lstrip("*"))
    return names


def own_doc(obj: Any) -> str | None:
    """The docstring written for ``obj`` itself (a class's is not inherited)."""
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__")
        return doc if isinstance(doc, str) else None
    return inspect.getdoc(obj)


def parameters(fn: Callable[..., Any]) -> list[str]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [name for name in sig.parameters if name not in ("self", "cls")]


def is_ours(obj: Any) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return module == "smartnsq" or module.startswith("smartnsq.")


def public_objects() -> Iterator[tuple[str, Any]]:
    for module in MODULES:
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                yield f"{module.__name__}.{name}", obj


def class_members(cls: type) -> Iterator[tuple[str, Any]]:
    """Public methods and properties that smartnsq code defines on ``cls`` or its bases."""
    for klass in cls.__mro__:
        if not is_ours(klass):
            continue
        for name, member in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(member, property):
                yield name, member
            elif isinstance(member, staticmethod | classmethod):
                yield name, member.__func__
            elif inspect.isfunction(member):
                yield name, member


def undocumented(qualname: str, obj: Any) -> list[str]:
    problems: list[str] = []
    if inspect.isclass(obj):
        if not own_doc(obj):
            problems.append(f"{qualname}: no docstring")
        init = obj.__init__
        # Where __init__ is defined: a public base documents its own parameters; a base
        # that is not public (say, the producers' shared core) leaves that to this class.
        definer = next(k for k in obj.__mro__ if "__init__" in vars(k))
        public = {id(o) for _, o in public_objects()}
        if (
            inspect.isfunction(init)
            and is_ours(definer)
            and (definer is obj or id(definer) not in public)
        ):
            names = documented_names(own_doc(obj)) | documented_names(inspect.getdoc(init))
            params = parameters(init)
            if dataclasses.is_dataclass(obj):
                params = [f.name for f in dataclasses.fields(obj)]
            problems += [
                f"{qualname}: parameter {p!r} not in an Args section"
                for p in params
                if p not in names
            ]
        seen: set[str] = set()
        for name, member in class_members(obj):
            if name in seen:
                continue
            seen.add(name)
            problems += undocumented(f"{qualname}.{name}", member)
        return problems
    if isinstance(obj, property):
        if not inspect.getdoc(obj):
            problems.append(f"{qualname}: no docstring")
        return problems
    if not isinstance(obj, types.FunctionType) or not obj.__doc__:
        return [f"{qualname}: no docstring"]
    names = documented_names(obj.__doc__)
    problems += [
        f"{qualname}: parameter {p!r} not in an Args section"
        for p in parameters(obj)
        if p not in names
    ]
    return problems


def test_every_public_callable_and_parameter_is_documented() -> None:
    problems: list[str] = []
    for qualname, obj in public_objects():
        problems += undocumented(qualname, obj)
    assert not problems, "undocumented public API:\n" + "\n".join(problems)


def test_the_walk_covers_the_public_api() -> None:
    """The check above looks where it should: the main classes and their parameters."""
    names = dict(public_objects())
    for expected in (
        "smartnsq.Consumer",
        "smartnsq.Producer",
        "smartnsq.Message",
        "smartnsq.run",
        "smartnsq.serve",
        "smartnsq.sync.Producer",
        "smartnsq.sync.Consumer",
        "smartnsq.trace.TraceSwitch",
        "smartnsq.errors.PartialPublish",
    ):
        assert expected in names
    members = dict(class_members(smartnsq.Message))
    assert {"finish", "requeue", "touch", "disable_auto_response", "headers"} <= set(members)
    assert "max_in_flight" in parameters(smartnsq.Consumer.__init__)
    assert "max_delay" in parameters(smartnsq.Producer.__init__)


def _documented(doc: str) -> list[str]:
    def fn(alpha: int, beta: int, *args: int, **options: int) -> None:
        pass

    fn.__doc__ = doc
    return undocumented("fn", fn)


def test_a_parameter_missing_from_args_is_reported() -> None:
    doc = """Do it.

    Args:
        alpha: The first.
        *args: More.
        **options: Options.

    Returns:
        beta: not an argument entry.
    """
    assert _documented(doc) == ["fn: parameter 'beta' not in an Args section"]


def test_a_name_in_a_description_does_not_count() -> None:
    doc = """Do it.

    Args:
        alpha: The first, unlike
            beta: which is only mentioned here.
        args: More.
        options: Options.
    """
    assert _documented(doc) == ["fn: parameter 'beta' not in an Args section"]


def test_a_missing_docstring_is_reported() -> None:
    class Thing:
        def __init__(self, size: int) -> None:
            self.size = size

        def grow(self, by: int) -> None:
            """Grow.

            Args:
                by: How much.
            """

        @property
        def double(self) -> int:
            return self.size * 2

    Thing.__module__ = "smartnsq.fake"
    assert undocumented("Thing", Thing) == [
        "Thing: no docstring",
        "Thing: parameter 'size' not in an Args section",
        "Thing.double: no docstring",
    ]


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ("Do.\n\n    Args:\n        a: x\n        b (int): y\n", {"a", "b"}),
        ("Do.\n\n    Attributes:\n        a: x\n\n    Returns:\n        b: y\n", {"a"}),
        ("Do.\n\n    Raises:\n        ValueError: x\n", set()),
        (None, set()),
    ],
)
def test_documented_names(doc: str | None, expected: set[str]) -> None:
    assert documented_names(doc) == expected
