"""docs/architecture.md names every module under exporter/, dashboards/ and harness/previews/
(the dashboards' docs tool), and every module it names exists, its glossary's names resolve,
each concept it fixes has one row, and the code declares none of the names it retired: the map
cannot drift from the tree, nor the names."""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
NAMED = re.compile(r"`((?:exporter|dashboards|harness/previews)/[\w/]+\.py)`")
MAPPED = ("exporter", "dashboards", "harness/previews")


def test_every_module_is_named_and_every_named_module_exists() -> None:
    tree = {str(p.relative_to(ROOT)) for top in MAPPED for p in ROOT.glob(f"{top}/**/*.py")}
    named = set(NAMED.findall(DOC.read_text(encoding="utf-8")))
    assert not tree - named, f"modules docs/architecture.md does not name: {sorted(tree - named)}"
    assert not named - tree, (
        f"docs/architecture.md names modules that do not exist: {sorted(named - tree)}"
    )


GLOSSED = re.compile(r"`((?:exporter|dashboards)[\w.]*):(\w+)`")


def test_every_name_in_the_glossary_resolves() -> None:
    names = GLOSSED.findall(glossary())
    assert len(names) >= 15
    missing = [f"{m}:{n}" for m, n in names if not hasattr(importlib.import_module(m), n)]
    assert not missing, f"glossary names that no longer exist: {missing}"


# the concepts whose names the glossary fixes (issue 65): each has one row of its own
TERMS = (
    "engine",
    "kind",
    "rank",
    "target",
    "upstream",
    "upstream pool",
    "snapshot",
    "draft length (k)",
    "schedule range",
    "band",
    "span",
    "window",
)
# identifiers that named a concept the glossary names otherwise (k is a formula's symbol only)
RETIRED = {
    "k": "draft_length",
    "K": "draft_length (a type variable: Key)",
    "engine_id": "rank",
    "ALL_ENGINES": "ALL_RANKS",
}
# (module, class or None, name): attributes of the old names
RETIRED_ATTRIBUTES = (
    ("exporter.core.schedule", "Schedule", "band"),  # a schedule's is a range (`range_at`)
    ("exporter.core.schedule", "Schedule", "bands"),
    ("exporter.core.payoff", "StepCurve", "k"),  # `draft_length`
    ("exporter.core.windows", "History", "span"),  # seconds covered: `covered`
    ("exporter.measure.level", "Phase", "window"),  # a phase's steady part: `steady_span`
    ("exporter.proxy.upstream", None, "Upstream"),  # the pool: `UpstreamPool`
    ("exporter.proxy.settings", "Settings", "upstream"),  # `pool`
    ("exporter.export.target_collector", None, "ALL_ENGINES"),
)


def glossary() -> str:
    text = DOC.read_text(encoding="utf-8")
    return text[text.index("## Glossary") : text.index("## What each module may import")]


def test_each_concept_has_one_row() -> None:
    terms = [
        line.split("|")[1].strip() for line in glossary().splitlines() if line.startswith("| ")
    ]
    assert not [t for t in TERMS if terms.count(t) != 1], terms


def declared(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """The names a module declares: parameters, module and class constants and fields, and
    attributes it sets (a function's locals are its own: a formula's k may stay)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs):
                yield arg.arg, arg.lineno
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            yield node.attr, node.lineno
        elif isinstance(node, (ast.Module, ast.ClassDef)):
            for statement in node.body:
                targets = (
                    statement.targets
                    if isinstance(statement, ast.Assign)
                    else [statement.target]
                    if isinstance(statement, ast.AnnAssign)
                    else []
                )
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            yield name.id, name.lineno


def test_the_code_keeps_to_the_glossarys_names() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {name} (the glossary's: {RETIRED[name]})"
        for path in sorted([*ROOT.glob("exporter/**/*.py"), *ROOT.glob("dashboards/**/*.py")])
        for name, line in declared(ast.parse(path.read_text(encoding="utf-8")))
        if name in RETIRED
    ]
    for module, owner, name in RETIRED_ATTRIBUTES:
        holder = importlib.import_module(module)
        if owner is not None:
            holder = getattr(holder, owner)
        if hasattr(holder, name):
            found.append(f"{module}:{owner or ''}.{name}")
    assert not found, found
