"""The docs say what the code does: every exported family is in the metric contract, the
configuration example loads and shows every key, counts in the README match the rule files,
and nothing points outside the repository."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import yaml

from exporter.config import load
from exporter.config.schema import Config, ModelConfig, ProxyConfig, Route, Target, keys

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
WORDS = {
    2: "two",
    3: "three",
    4: "four",
    5: "five",
    6: "six",
    7: "seven",
    8: "eight",
    9: "nine",
    10: "ten",
    11: "eleven",
    12: "twelve",
    13: "thirteen",
}


def exported_families() -> set[str]:
    """Family names the collectors build (`CounterMetricFamily("specdec_x", ...)` and kin)."""
    names = set()
    for path in (ROOT / "exporter" / "export").glob("*.py"):
        text = path.read_text(encoding="utf-8")
        names |= set(re.findall(r'MetricFamily\(\s*"(specdec_[a-z_]+)"', text))
        names |= set(re.findall(r'family\(\s*"(specdec_[a-z_]+)"', text))
        names |= {n for n, _ in re.findall(r'\(\s*"(specdec_[a-z_]+)",\s*\n?\s*"([^"]+)"', text)}
    return names


def test_every_exported_family_is_in_the_metric_contract() -> None:
    contract = (DOCS / "metrics.md").read_text(encoding="utf-8")
    families = exported_families()
    assert len(families) >= 30, families
    missing = sorted(
        f for f in families if f"`{f}`" not in contract and f"`{f}_total`" not in contract
    )
    assert not missing, f"exported but not in docs/metrics.md: {missing}"


def test_the_configuration_example_loads_and_shows_every_key(tmp_path: Path) -> None:
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    block = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert block is not None
    path = tmp_path / "specdec.yaml"
    path.write_text(block.group(1), encoding="utf-8")
    config = load(path)
    assert config.proxy is not None and config.models
    doc = yaml.safe_load(block.group(1))
    shown = {
        Config: [doc],
        Target: doc["targets"],
        ProxyConfig: [doc["proxy"]],
        ModelConfig: doc["models"],
    }
    for cls, items in shown.items():
        given = {k for item in items for k in item}
        assert set(keys(cls)) <= given, (cls.__name__, set(keys(cls)) - given)
    conditions = {k for r in doc["proxy"]["routes"] for k in r["when"]}
    assert conditions == set(keys(Route, "when"))
    assert len(fields(Route)) == 1 + len(conditions)


def test_the_readme_counts_what_the_rule_files_hold() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rules = (ROOT / "deploy" / "prometheus" / "rules").glob("*.yml")
    alerts = sum(
        1
        for path in rules
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
        for rule in group["rules"]
        if "alert" in rule
    )
    assert f"{WORDS[alerts]} alerts" in readme, alerts


def test_the_readme_is_short_and_has_both_command_blocks() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 160
    assert "specdec demo" in readme
    assert "python3 -m pytest -q -p no:cacheprovider" in readme  # what .ci/run calls
    assert "make test-all" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_the_makefile_and_ci_name_the_readmes_test_commands() -> None:
    """The README's test command (its code block) is `make test-all`, what CI runs; `make test`
    is its fast tier; the Makefile's and .ci/run's comments say the same."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    block = readme[readme.index("## Tests") :].split("```bash\n")[1].split("```")[0]
    assert "\nmake test-all " in block, block
    assert "README's test command, `make test-all`" in makefile
    assert "README's test command, `make test-all`" in " ".join(ci.split())
    assert "\nmake test-all || status=$?\n" in ci


def test_nothing_points_outside_the_repository() -> None:
    suffixes = {".md", ".py", ".ts", ".yml", ".yaml", ".toml"}
    outside = re.compile(r"\.\./shared|/work/|shared/(STATISTICS|VLLM_FACTS|DESIGN|ENGINE_FACTS)")
    skip = {"node_modules", ".git", ".venv", "specdec.egg-info"}
    found = [
        str(p.relative_to(ROOT))
        for p in ROOT.rglob("*")
        if p.suffix in suffixes
        and not skip & set(p.parts)
        and p.is_file()
        and p.name != "test_docs.py"
        and outside.search(p.read_text(encoding="utf-8", errors="replace"))
    ]
    assert not found, found


def test_the_benchmark_reference_is_a_reference_not_a_log() -> None:
    """docs/BENCHMARKS.md says what each bench measures, its latest figure and what stands; the
    run-by-run record is data in bench/results/ (rendered by bench/render.py)."""
    text = (DOCS / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 400, len(text.splitlines())
    assert "bench/render.py" in text and "bench/results/" in text


def test_no_product_doc_or_docstring_cites_a_run_number() -> None:
    """A run number means something only beside its run's figures: product docs and docstrings
    say why, self-contained. The one exception: BENCHMARKS.md's pointer to the result files."""
    paths = [*DOCS.glob("*.md")]
    for folder in ("exporter", "dashboards"):
        paths += [p for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix != ".pyc"]
    found = [
        (str(path.relative_to(ROOT)), n, line)
        for path in paths
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"run [0-9]", line)
    ]
    pointer = [f for f in found if f[0] == "docs/BENCHMARKS.md" and "bench/render.py" in f[2]]
    assert len(pointer) <= 1, pointer
    assert [f for f in found if f not in pointer] == []
