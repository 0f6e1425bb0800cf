"""The engines layer: every engine in the registry goes through the same scrape and proxy
contracts, and no module outside `exporter/engines/` tests an engine's name (the simulator,
which plays the engines rather than reads them, aside)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from exporter.config import ENGINE_KINDS
from exporter.engines import KINDS, engine

ROOT = Path(__file__).resolve().parents[2]
PLAYS_ENGINES = ("exporter/engines/", "exporter/sim/")


def names_tested(path: Path) -> list[str]:
    """`file:line` of each comparison with an engine's name, or dict keyed by one."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            literals = [
                c
                for p in parts
                for c in ([p] if not isinstance(p, (ast.Tuple, ast.List, ast.Set)) else p.elts)
            ]
        elif isinstance(node, ast.Dict):
            literals = [k for k in node.keys if k is not None]
        else:
            continue
        if any(isinstance(c, ast.Constant) and c.value in KINDS for c in literals):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_module_outside_the_engines_tests_an_engine_name() -> None:
    sources = [
        p
        for p in sorted([*ROOT.glob("exporter/**/*.py"), *ROOT.glob("dashboards/**/*.py")])
        if not str(p.relative_to(ROOT)).startswith(PLAYS_ENGINES)
    ]
    offenders = [hit for p in sources for hit in names_tested(p)]
    assert not offenders, offenders


def test_the_names_test_finds_a_comparison() -> None:  # the check above can fail
    probe = ROOT / "tests" / "unit" / "_probe_engine_name.py"
    probe.write_text('def f(kind: str) -> bool:\n    return kind == "sglang"\n')
    try:
        assert names_tested(probe) == ["tests/unit/_probe_engine_name.py:2"]
    finally:
        probe.unlink()


def test_the_config_checks_against_the_registry() -> None:
    assert ENGINE_KINDS == KINDS == ("vllm", "sglang", "llamacpp", "trtllm")
    with pytest.raises(ValueError, match="expected one of vllm, sglang, llamacpp, trtllm"):
        engine("tgi")
