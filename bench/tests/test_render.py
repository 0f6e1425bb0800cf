"""bench/render.py makes the record's tables from bench/results/: every committed result file is
well formed and its figures reach the rendered text, each bench's summary is its latest run, a
fresh `record()` renders, and the tables docs/BENCHMARKS.md shows are what the files hold."""

from __future__ import annotations

import datetime
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from bench import render

BENCH = Path(__file__).resolve().parents[1]
DOC = BENCH.parent / "docs" / "BENCHMARKS.md"
RECORDS = render.load()


def load_run() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_run", BENCH / "_run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("_run", module)
    spec.loader.exec_module(module)
    return module


def scalars(figures: dict[str, Any]) -> list[Any]:
    """The values a figure/value table shows (what `render.figures` does not leave out)."""
    out: list[Any] = []
    for key, value in figures.items():
        if key in ("tables", "printed") or key in render.BULK or value is None:
            continue
        if render.is_rows(value):
            out += [v for row in value for v in render.flat(row).values()]
        else:
            out += [v for v in render.flat(value, key).values() if v is not None]
    return out


def test_there_is_a_record_of_every_bench_that_prints_figures() -> None:
    benches = {r["bench"] for r in RECORDS}
    scripts = {"bench_parse", "bench_sidecar_cpu", "bench_proxy", "bench_relay", "bench_collect",
               "bench_memory", "soak", "alert_quality", "cpu_steadiness", "gpu_payoff",
               "payoff_real_vllm", "real_vllm_steadiness", "config_path", "coverage",
               "coverage_promql"}  # fmt: skip
    assert scripts <= benches, scripts - benches
    for name in scripts - {"soak"}:  # each script has the flag that writes its result file
        assert "add_outputs(" in (BENCH / f"{name}.py").read_text(encoding="utf-8"), name


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r["_file"])
def test_each_result_file_is_a_run_with_its_commit_command_machine_and_figures(
    record: dict[str, Any],
) -> None:
    assert record["_file"].startswith(record["bench"] + "-")
    for key in ("commit", "command", "machine", "figures"):
        assert record[key], key
    datetime.date.fromisoformat(record["started_utc"][:10])
    figures = record["figures"]
    assert figures and isinstance(figures, dict)
    for table in figures.get("tables", []):
        assert table["rows"] and all(len(r) == len(table["columns"]) for r in table["rows"])


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r["_file"])
def test_every_run_renders_with_all_its_figures(record: dict[str, Any]) -> None:
    text = render.render(RECORDS, [record["bench"]], every=True, notes=True)
    assert f"bench/results/{record['_file']}" in text
    figures = record["figures"]
    for table in figures.get("tables", []):
        for row in [table["columns"], *table["rows"]]:
            assert "| " + " | ".join(render.cell(v) for v in row) + " |" in text
    printed = figures.get("printed") or []
    for block in [printed] if isinstance(printed, str) else printed:
        assert block.strip("\n") in text
    for value in scalars(figures):
        assert render.cell(value) in text, value
    if record.get("notes"):
        assert record["notes"].strip() in text


def test_a_benchs_summary_is_its_latest_run() -> None:
    for bench in {r["bench"] for r in RECORDS}:
        runs = [r for r in RECORDS if r["bench"] == bench]
        newest = max(runs, key=lambda r: (r["started_utc"], r.get("order", 0), r["_file"]))
        text = render.render(RECORDS, [bench])
        assert text.startswith(f"**{bench}**, latest: {render.when(newest)}")
        assert f"bench/results/{newest['_file']}" in text
        assert sum(f"bench/results/{r['_file']}" in text for r in runs) == 1


def test_a_fresh_record_renders(tmp_path: Path) -> None:
    run = load_run()
    figures = {"pages": [{"page": "p", "ratio": 43.25}], "goal_ratio": 43.25, "rss": {"end": 41.0}}
    path = run.record("bench_parse", figures, notes="a quiet machine", into=tmp_path)
    records = render.load(tmp_path)
    assert [r["_file"] for r in records] == [path.name]
    assert records[0]["commit"] and records[0]["machine"]["cpus"]
    text = render.render(records, notes=True)
    for shown in ("| p | 43.25 |", "| goal_ratio | 43.25 |", "| rss.end | 41 |", "quiet machine"):
        assert shown in text, shown


def test_the_benchmark_docs_tables_are_rendered_from_the_result_files() -> None:
    doc = DOC.read_text(encoding="utf-8")
    assert render.BLOCK.search(doc), "no rendered block in docs/BENCHMARKS.md"
    assert render.blocks(doc, RECORDS) == doc, (
        "docs/BENCHMARKS.md's tables differ from bench/results/: "
        "python3 bench/render.py --write docs/BENCHMARKS.md"
    )
