"""hpcorch's modules import one another without circles: imports point down.

Every import counts, wherever it stands: at the top of a module, under ``if
TYPE_CHECKING:`` and inside a function. A circle hidden behind ``TYPE_CHECKING`` or a lazy
import is still a circle: the two modules can be read, tested and changed only together.
"""

from __future__ import annotations

import ast
from pathlib import Path

import hpcorch

PACKAGE = Path(hpcorch.__file__).resolve().parent


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of ``package`` by its dotted name (a package by its own name)."""
    out = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """``name -> the modules of mods it imports`` (``from a.b import c`` names the module
    ``a.b.c`` where there is one, else ``a.b``)."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[: len(here) - node.level + 1]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                for a in node.names:
                    full = f"{source}.{a.name}"
                    if full in mods:
                        graph[name].add(full)
                    elif source in mods:
                        graph[name].add(source)
        graph[name].discard(name)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_check_finds_a_circle_behind_type_checking(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import thing\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import other\n"
    )
    (pkg / "c.py").write_text("def f():\n    from . import d\n")
    (pkg / "d.py").write_text("from .c import f\n")
    (pkg / "e.py").write_text("import pkg.a\n")
    assert circles(import_graph(modules(pkg))) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d"]]


def test_hpcorch_has_no_import_circle() -> None:
    graph = import_graph(modules())
    assert len(graph) > 100  # the whole package was read
    found = circles(graph)
    assert not found, "import circles: " + "; ".join(
        " <-> ".join(f"{m} (imports {', '.join(sorted(graph[m] & set(g)))})" for m in g)
        for g in found
    )
