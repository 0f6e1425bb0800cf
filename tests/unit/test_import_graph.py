"""The import graph of the whole tree: no circle anywhere (the product, the dashboards, the
harness, the bench, the tests), and the bench fenced off: nothing outside bench/ imports it,
and it stands only on the product and the harness (the tests and the bench share what they both
need through harness/, never through each other)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("exporter", "dashboards", "harness", "bench", "tests")
# what each top-level package may import of the others (besides itself)
MAY_IMPORT = {
    "exporter": {"dashboards"},  # `specdec rules` / `specdec dashboards` build them
    "dashboards": {"exporter"},
    "harness": {"exporter", "dashboards"},
    "bench": {"exporter", "dashboards", "harness"},
    "tests": {"exporter", "dashboards", "harness"},
}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "node_modules" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def graph() -> dict[str, set[str]]:
    """module -> the tree's modules it imports (anywhere in it)."""
    known = modules()

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in known}
    for module, path in known.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            for name in names:
                target = resolve(name)
                if target is not None and target != module:
                    edges[module].add(target)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_circle_anywhere_in_the_tree() -> None:
    assert circles(graph()) == []


def test_the_circle_finder_finds_one() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_each_package_imports_only_what_it_may() -> None:
    wrong = sorted(
        (module, target)
        for module, targets in graph().items()
        for target in targets
        if (own := module.split(".")[0]) != (theirs := target.split(".")[0])
        and theirs not in MAY_IMPORT[own]
    )
    assert wrong == [], wrong  # e.g. ('tests.x', 'bench.y'): the bench is nobody's library
