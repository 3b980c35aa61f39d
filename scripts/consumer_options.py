"""Write the Consumers' keyword arguments from their one definition, ``Options``.

Each option of a Consumer is declared once, as a field of ``Options`` in
``smartnsq/consumer/options.py``: its name, type, default and description (the string under
the field). From it this script writes the signature and the ``Args:`` entries of
``smartnsq.Consumer.__init__`` and ``smartnsq.sync.Consumer.__init__``, as plain source, so
that IDEs, ``help()`` and the API pages show every keyword with its type and default. Edit the
field, then run the script; a stale copy fails ``--check`` (``./dev lint`` and the tests).

A description that states the default ("Default 5.", "``None`` (default)") must state the
field's: the script refuses one that does not.

    python scripts/consumer_options.py          # rewrite the signatures
    python scripts/consumer_options.py --check  # exit 1 (saying which) when one is stale

Run from anywhere; paths are the repository's.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "smartnsq/consumer/options.py"

# (file, class whose __init__ takes the options, Args entries kept as written there)
TARGETS = [
    ("smartnsq/consumer/front.py", "Consumer", frozenset()),
    ("smartnsq/sync/consumer.py", "Consumer", frozenset({"topic", "channel", "handler"})),
]

WIDTH = 100  # the project's line length
_LITERAL = r"-?\d[\d.]*|True|False|None"
# "Default 5", "default: None", "``None`` (default)", "0 (the default)"
_CLAIMS = (
    re.compile(rf"\b[Dd]efault:? (?:``)?({_LITERAL})\b"),
    re.compile(rf"(?<![\w.])(?:``)?({_LITERAL})(?:``)? \((?:the )?default\)"),
)

# A wrapped line starting so would be a list item, heading or quote in the API pages.
_BLOCK = re.compile(r"([-*+] |#|>|\d+[.)] )")


@dataclass(frozen=True)
class Option:
    name: str
    annotation: str
    default: str | None  # source text; None: required
    doc: str
    keyword_only: bool


def read_options(text: str) -> list[Option]:
    """The fields of ``Options`` in ``text`` (options.py), in order."""
    tree = ast.parse(text)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Options")
    options: list[Option] = []
    keyword_only = False
    body = cls.body
    for i, node in enumerate(body):
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        annotation = ast.get_source_segment(text, node.annotation)
        assert annotation is not None
        if annotation == "KW_ONLY":
            keyword_only = True
            continue
        name = node.target.id
        after = body[i + 1] if i + 1 < len(body) else None
        if not (
            isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            raise SystemExit(f"consumer_options: Options.{name} needs a description under it")
        default = node.value
        if isinstance(default, ast.Call) and ast.unparse(default.func) == "field":
            default = next((k.value for k in default.keywords if k.arg == "default"), None)
            if default is None:
                raise SystemExit(f"consumer_options: Options.{name}: field() without a default")
        source = None if default is None else ast.get_source_segment(text, default)
        doc = " ".join(inspect.cleandoc(after.value.value).split())
        check_claims(name, doc, source)
        options.append(Option(name, annotation, source, doc, keyword_only))
    return options


def check_claims(name: str, doc: str, default: str | None) -> None:
    for claim in _CLAIMS:
        for found in claim.finditer(doc):
            if found.group(1) != default:
                raise SystemExit(
                    f"consumer_options: Options.{name}'s description says the default is "
                    f"{found.group(1)}, the field says {default}: correct the description"
                )


def parameters(options: list[Option]) -> list[str]:
    lines = ["        self,\n"]
    star = False
    for o in options:
        if o.keyword_only and not star:
            lines.append("        *,\n")
            star = True
        default = "" if o.default is None else f" = {o.default}"
        lines.append(f"        {o.name}: {o.annotation}{default},\n")
    return lines


def args_entry(option: Option) -> list[str]:
    text = textwrap.fill(
        option.doc,
        width=WIDTH,
        initial_indent=f"            {option.name}: ",
        subsequent_indent=" " * 16,
        break_long_words=False,
        break_on_hyphens=False,
    )
    lines = text.splitlines()
    for line in lines[1:]:
        if _BLOCK.match(line.lstrip()):
            raise SystemExit(
                f"consumer_options: Options.{option.name}'s description wraps to a line that "
                f"Markdown reads as a list or heading ({line.strip()[:20]!r}...): reword it"
            )
    return [line + "\n" for line in lines]


def written_entries(lines: list[str]) -> dict[str, list[str]]:
    """The Args entries in ``lines`` (the section's body), by name."""
    entries: dict[str, list[str]] = {}
    current: list[str] = []
    for line in lines:
        entry = re.match(r" {12}\**(\w+):", line)
        if entry is not None:
            current = entries.setdefault(entry.group(1), [])
        current.append(line)
    return entries


def rewrite(text: str, class_name: str, keep: frozenset[str], options: list[Option]) -> str:
    """``text`` with ``class_name.__init__``'s signature and Args entries written from
    ``options``."""
    tree = ast.parse(text)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    doc = init.body[0]
    if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)):
        raise SystemExit(f"consumer_options: {class_name}.__init__ needs a docstring")
    lines = text.splitlines(True)
    # The def's lines run up to the docstring; the signature, one parameter a line.
    head = ["    def __init__(\n", *parameters(options), "    ) -> None:\n"]
    doc_lines = lines[doc.lineno - 1 : doc.end_lineno]
    try:
        start = doc_lines.index("        Args:\n") + 1
    except ValueError:
        raise SystemExit(
            f"consumer_options: {class_name}.__init__'s docstring needs Args:"
        ) from None
    end = start
    while end < len(doc_lines) and doc_lines[end].strip() and doc_lines[end].startswith(" " * 12):
        end += 1
    written = written_entries(doc_lines[start:end])
    args: list[str] = []
    for o in options:
        if o.name in keep:
            if o.name not in written:
                raise SystemExit(f"consumer_options: {class_name}.__init__ must describe {o.name}")
            args += written[o.name]
        else:
            args += args_entry(o)
    doc_lines[start:end] = args
    out = lines[: init.lineno - 1] + head + doc_lines + lines[doc.end_lineno :]
    return "".join(out)


def ruff_format(text: str, name: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--quiet", "--stdin-filename", name, "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"consumer_options: ruff format failed on {name}:\n{done.stderr}")
    return done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say whether files are stale")
    check = parser.parse_args(argv).check
    options = read_options((ROOT / SOURCE).read_text())
    stale = []
    for target, class_name, keep in TARGETS:
        path = ROOT / target
        text = path.read_text()
        wanted = ruff_format(rewrite(text, class_name, keep, options), target)
        if text == wanted:
            continue
        if check:
            stale.append(target)
        else:
            path.write_text(wanted)
            print(f"consumer_options: wrote {target}")
    if stale:
        print(
            f"consumer_options: {', '.join(stale)} is stale (or edited by hand): the options "
            f"are defined in {SOURCE}; run `python scripts/consumer_options.py`",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
