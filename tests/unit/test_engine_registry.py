"""The engines layer: every engine in the registry goes through the same scrape and proxy
contracts, and no module outside `exporter/engines/` names an engine, one of its metrics or one
of its own wire members in a string literal (the simulator, which plays the engines rather than
reads them, aside)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from exporter.engines import KINDS, base, engine

ROOT = Path(__file__).resolve().parents[2]
PLAYS_ENGINES = ("exporter/engines/", "exporter/sim/")
# members only one engine sends or reads: SGLang's details, llama.cpp's timings and slots
WIRE = ("sglext", "spec_tokens_details", "timings", "predicted_n", "draft_n", "id_slot")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants (prose may name an engine)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def names_tested(path: Path, root: Path = ROOT) -> list[str]:
    """`file:line` of each string literal that is an engine's name or starts with an engine's
    metric prefix (a metric name), docstrings aside: engine knowledge belongs in its module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    prose = _docstrings(tree)
    prefixes = tuple(engine(kind).prefix for kind in KINDS)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, (str, bytes)):
            continue
        if id(node) in prose:
            continue
        value = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
        wire = any(value == key or f'"{key}"' in value for key in WIRE)
        if value in KINDS or value.startswith(prefixes) or wire:
            found.append(f"{path.relative_to(root)}:{node.lineno}")
    return sorted(found)


def test_no_module_outside_the_engines_names_an_engine() -> None:
    sources = [
        p
        for p in sorted([*ROOT.glob("exporter/**/*.py"), *ROOT.glob("dashboards/**/*.py")])
        if not str(p.relative_to(ROOT)).startswith(PLAYS_ENGINES)
    ]
    offenders = [hit for p in sources for hit in names_tested(p)]
    assert not offenders, offenders


@pytest.mark.parametrize(
    "line",
    [
        'def f(kind: str) -> bool:\n    return kind == "sglang"\n',
        'RUNNING = "vllm:num_requests_running"\n',
        'DEFAULTS = {"llamacpp": 1}\n',
        'def f() -> str:\n    """Docs may say vllm."""\n    return "trtllm_spec_decode"\n',
        'def f(doc: dict) -> object:\n    return doc.get("timings")\n',
        "SGLEXT = b'\"sglext\":{'\n",
    ],
)
def test_a_planted_engine_literal_is_found(tmp_path: Path, line: str) -> None:
    probe = tmp_path / "probe.py"  # the check above can fail
    probe.write_text(line)
    assert len(names_tested(probe, tmp_path)) == 1


def test_the_config_checks_against_the_registry() -> None:
    assert KINDS == ("vllm", "sglang", "llamacpp", "trtllm")
    with pytest.raises(ValueError, match="expected one of vllm, sglang, llamacpp, trtllm"):
        engine("tgi")


# each side of the sidecar is typed with its own hooks (mypy holds it to them); none takes `Engine`
SIDES = {"exporter/scrape/": "ScrapeHooks", "exporter/export/": "ScrapeHooks"}
SIDES |= {"exporter/proxy/": "ProxyHooks"}


def base_names_imported(path: Path) -> set[str]:
    """The names a module imports from `exporter.engines.base`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "exporter.engines.base"
        for alias in node.names
    }


def test_each_side_takes_its_own_hooks_not_the_whole_engine() -> None:
    hooks = {"ScrapeHooks", "ProxyHooks", "LoadHooks", "RequestHooks"}
    wrong = {
        f"{path.relative_to(ROOT)}: {sorted(names)}"
        for side, own in SIDES.items()
        for path in sorted(ROOT.glob(f"{side}*.py"))
        if (names := base_names_imported(path) & (hooks - {own} | {"Engine"}))
    }
    assert not wrong, wrong
    assert base_names_imported(ROOT / "exporter/proxy/relay.py") == {"ProxyHooks"}  # can fail


@pytest.mark.parametrize("kind", KINDS)
def test_every_engine_has_every_sides_hooks(kind: str) -> None:
    found = engine(kind)
    for hooks in (base.ScrapeHooks, base.ProxyHooks, base.LoadHooks):
        protocols = [c for c in hooks.__mro__ if c.__name__.endswith("Hooks")]
        members = {m for c in protocols for m in vars(c) if not m.startswith("_")}
        assert "kind" in members and all(hasattr(found, m) for m in members), (hooks, members)
