"""Imports point one way: cli -> sidecar / demo -> scrape, proxy, export -> accounting ->
config -> core; in the mixin (dashboards/), cli -> rules -> alerts, and rules, alerts and boards
side by side on the one config and the shared queries.
docs/architecture.md states the same table; this test holds the code to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.imports import graph

ROOT = Path(__file__).resolve().parents[2]
ROOT_MODULE = "exporter"  # exporter/__init__.py (__version__) and exporter.logs: anyone's
SHARED = {"exporter.core", "exporter.logs", "exporter.process", "exporter.verbs", ROOT_MODULE}
MAY_IMPORT = {
    "exporter.core": set(),
    "exporter.engines": set(),  # each engine's knowledge, on core only
    "exporter.config": {"exporter.engines"},  # `engine:` is checked against the registry
    "exporter.scrape": {"exporter.config", "exporter.engines"},
    "exporter.accounting": {"exporter.config"},  # the routes' counts; read by snapshot
    "exporter.proxy": {"exporter.config", "exporter.engines", "exporter.accounting"},
    "exporter.export": {
        "exporter.config",
        "exporter.engines",
        "exporter.scrape",
        "exporter.proxy",
        "exporter.accounting",
    },
    "exporter.sim": set(),
    "exporter.measure": {"exporter.scrape", "exporter.engines"},
    "exporter.sidecar": {
        "exporter.config",
        "exporter.engines",
        "exporter.scrape",
        "exporter.accounting",
        "exporter.proxy",
        "exporter.export",
    },
    "exporter.demo": {
        "exporter.config",
        "exporter.measure",
        "exporter.accounting",  # the workload lines read the routes' accounting
        "exporter.sidecar",
        "exporter.sim",
        "exporter.demo_prometheus",
        "exporter.demo_history",
    },
    "exporter.demo_prometheus": {"exporter.demo_history"},  # it backfills the history it gets
    "exporter.demo_history": set(),
    "exporter.cli": {"exporter"},  # the verbs compose everything (dashboards' come by entry point)
    "exporter.logs": set(),
    "exporter.process": set(),
    "exporter.verbs": set(),
    ROOT_MODULE: set(),
    "exporter.__main__": {"exporter.cli"},
    # the mixin: one config; alerts, rules and boards its siblings, on the shared queries
    "dashboards": set(),  # the package
    "dashboards.config": {"exporter.config"},  # the mixin file is read as the sidecar config is
    "dashboards.queries": set(),  # PromQL on core's constants: no config, no layout
    "dashboards.alerts": {"dashboards.config", "dashboards.queries"},
    "dashboards.rules": {"dashboards.config", "dashboards.queries", "dashboards.alerts"},
    "dashboards.boards": {"dashboards.config", "dashboards.queries"},  # rules by name only
    "dashboards.cli": {
        "dashboards.config",
        "dashboards.rules",
        "dashboards.boards",
        "exporter.config",  # ConfigError
    },
}


def layer(module: str) -> str:
    """The table's key for a module: its package (or top module) under exporter/ or
    dashboards/."""
    return ".".join(module.split(".")[:2])


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


GRAPH = graph(ROOT, ("exporter", "dashboards"))
SOURCES = sorted([*ROOT.glob("exporter/**/*.py"), *ROOT.glob("dashboards/**/*.py")])


def allowed(importer: str, imported: str) -> bool:
    own, target = layer(importer), layer(imported)
    if own == target or target in SHARED or imported in SHARED:
        return True
    grants = MAY_IMPORT[own]
    return ("exporter" in grants and target.startswith("exporter")) or target in grants


@pytest.mark.parametrize("path", SOURCES, ids=[module_name(p) for p in SOURCES])
def test_imports_point_one_way(path: Path) -> None:
    importer = module_name(path)
    assert layer(importer) in MAY_IMPORT, f"{importer}: a new package; give it a row"
    wrong = sorted(m for m in GRAPH[importer] if not allowed(importer, m))
    assert not wrong, f"{importer} imports {wrong}, against docs/architecture.md"


def test_the_table_catches_an_upward_import() -> None:
    assert not allowed("exporter.core.counts", "exporter.scrape.totals")
    assert not allowed("exporter.proxy.forward", "exporter.export.route_collector")
    assert not allowed("exporter.scrape.target", "exporter.proxy.forward")
    assert not allowed("dashboards.boards.build", "exporter.cli")
    assert allowed("dashboards.boards.panels", "exporter.core.durations")
    assert not allowed("dashboards.boards.payoff", "dashboards.rules")  # siblings
    assert not allowed("dashboards.alerts", "dashboards.boards.panels")
    assert not allowed("dashboards.queries.spec", "dashboards.config")
    assert allowed("dashboards.boards.payoff", "dashboards.queries.panel_queries")
    assert allowed("exporter.cli.serve", "exporter.sidecar")
