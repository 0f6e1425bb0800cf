"""The recording rules' split of an acceptance change (mix, within) and the sidecar's gauge
agree on the same counters: a sidecar's accounting fed requests in two regimes for 70 minutes,
its page scraped every 15 s as Prometheus would store it, promtool evaluating the rules on
those series, and the sidecar's own `specdec_route_acceptance_change_ratio` at the same
instant as the expected values."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dashboards.config import DEFAULT
from dashboards.queries.slices import change_rule
from exporter.accounting.ledger import Accounting, RequestOutcome
from exporter.config import Breakdown
from exporter.core.counts import Counts
from exporter.core.slices import slices
from exporter.core.windows import DEFAULT_WINDOWS, parse_window
from exporter.engines import engine
from exporter.export.route_collector import RouteCollector
from harness.helpers import need_tool

pytestmark = pytest.mark.promtool

REPO = Path(__file__).resolve().parents[2]
SCRAPE = 15
END = 70 * 60
CHANGE = 60 * 60
# per scrape interval: (temperature, output, prompt tokens, draft tokens, accepted), a request
# each; at CHANGE the clients move to sampling and the structured requests' drafter worsens
BEFORE = [(0.0, "text", 300, 60, 51)] * 4 + [
    (0.7, "structured", 3000, 60, 30),
    (None, "tools", 9000, 40, 8),
]
AFTER = [(0.0, "text", 300, 60, 50), (0.7, "text", 300, 60, 16)] * 2 + [
    (0.7, "structured", 3000, 60, 12)
]


def _request(acc: Accounting, spec: tuple[float | None, str, int, int, int]) -> None:
    temperature, output, prompt, drafted, accepted = spec
    band = "unset" if temperature is None else "greedy" if temperature == 0 else "mid"
    acc.record(
        RequestOutcome(
            "agent", "m", "200", 100, prompt_tokens=prompt,
            exact=Counts(drafted // 3, drafted, accepted), slices=slices((band, output), prompt),
        )
    )  # fmt: skip


def _slice_samples(page: str) -> dict[str, float]:
    """The page's slice counters, as promtool series names."""
    out = {}
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            if s.name.startswith("specdec_route_slice_") and s.name.endswith("_total"):
                labels = ", ".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                out[f'{s.name}{{{labels}, job="specdec", instance="a:10419"}}'] = s.value
    return out


def test_the_rules_and_the_gauge_split_the_change_alike(tmp_path: Path) -> None:
    promtool = need_tool("promtool")
    window, baseline = DEFAULT.breakdown.window, DEFAULT.breakdown.baseline
    breakdown = Breakdown(parse_window(window), parse_window(baseline))
    acc = Accounting(("agent",), DEFAULT_WINDOWS, {}, breakdown=breakdown)
    now = [0.0]
    collector = RouteCollector(acc, {}, None, engine("vllm"), lambda: now[0])
    registry = CollectorRegistry()
    registry.register(collector)
    series: dict[str, list[float]] = {}
    for i, t in enumerate(range(0, END + 1, SCRAPE)):
        if t:  # the requests that ended in the last interval
            for spec in BEFORE if t <= CHANGE else AFTER:
                _request(acc, spec)
        now[0] = float(t)
        acc.tick(t)
        for name, value in _slice_samples(generate_latest(registry).decode()).items():
            series.setdefault(name, [0.0] * i).append(value)
    gauge = {
        (s.labels["dimension"], s.labels["part"]): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
        if s.name == "specdec_route_acceptance_change_ratio"
    }
    assert {d for d, _ in gauge} == {"temperature", "output", "prompt_tokens"}
    assert gauge[("temperature", "mix")] < -0.05  # the traffic moved to sampling
    assert gauge[("output", "within")] < -0.05  # structured's drafter worsened
    rule = change_rule(window, baseline)
    doc = {
        "rule_files": [str(REPO / "deploy/prometheus/rules/specdec-recording.yml")],
        "evaluation_interval": "15s",
        "group_eval_order": [
            "specdec-route-baselines", "specdec-route_model_name", "specdec-model_name_engine"
        ],
        "tests": [{
            "interval": f"{SCRAPE}s",
            "input_series": [
                {"series": name, "values": " ".join(f"{v:g}" for v in values)}
                for name, values in sorted(series.items())
            ],
            "promql_expr_test": [{
                "expr": f"round({rule} * 1e5) / 1e5",
                "eval_time": f"{END}s",
                "exp_samples": [
                    {"labels": f'{{route="agent", model_name="m", dimension="{d}", part="{p}"}}',
                     "value": round(v * 1e5) / 1e5}
                    for (d, p), v in sorted(gauge.items())
                ],
            }],
        }],
    }  # fmt: skip
    path = tmp_path / "breakdown_agreement.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    out = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr
