"""The import graph of the whole tree: no circle anywhere (the product, the dashboards, the
harness, the bench, the tests), and the bench fenced off: nothing outside bench/ imports it,
and it stands only on the product and the harness (the tests and the bench share what they both
need through harness/, never through each other). What the wheel ships (exporter/, dashboards/)
never imports the rest: not the dashboards' previews (harness/previews, a docs tool), and
exporter/ not the dashboards, whose verbs it finds by entry point."""

from __future__ import annotations

from pathlib import Path

from tests.imports import circles, graph

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("exporter", "dashboards", "harness", "bench", "tests")
# what each top-level package may import of the others (besides itself)
MAY_IMPORT = {
    "exporter": set(),  # `specdec rules` / `specdec dashboards` come by entry point
    "dashboards": {"exporter"},  # never harness: the previews are no part of the wheel
    "harness": {"exporter", "dashboards"},
    "bench": {"exporter", "dashboards", "harness"},
    "tests": {"exporter", "dashboards", "harness"},
}


def tree() -> dict[str, set[str]]:
    return graph(ROOT, PACKAGES)


def test_no_circle_anywhere_in_the_tree() -> None:
    assert circles(tree()) == []


def test_a_planted_circle_is_found(tmp_path: Path) -> None:  # the check above can fail
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import A\n"
    )
    (pkg / "c.py").write_text("import pkg.a\n")
    assert circles(graph(tmp_path, ("pkg",))) == [["pkg.a", "pkg.sub.b"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_each_package_imports_only_what_it_may() -> None:
    wrong = sorted(
        (module, target)
        for module, targets in tree().items()
        for target in targets
        if (own := module.split(".")[0]) != (theirs := target.split(".")[0])
        and theirs not in MAY_IMPORT[own]
    )
    assert wrong == [], wrong  # e.g. ('tests.x', 'bench.y'): the bench is nobody's library


def test_no_module_imports_a_test_module() -> None:
    """What two test modules share lives in harness/ (or a helper module under tests/), so a
    test module is only ever collected, never imported for its helpers."""
    wrong = sorted(
        (module, target)
        for module, targets in tree().items()
        for target in targets
        if target.rsplit(".", 1)[-1].startswith("test_")
    )
    assert wrong == [], wrong
