"""Per-route traffic with realistic per-request spread, as a Prometheus scraping the sidecar every
15 s would store it, and promtool running the shipped rules over it.

Traffic model (the proxy's `source="exact"` accounting): requests complete as a Poisson process
at a route's rate; each runs a number of verify steps (k = 3 drafts each) and draws its own
acceptance from Beta(mean c, (1 - mean) c) around the route's mean at the time it started (or,
on a route mixing kinds of prompts, around its kind's mean); its steps are drawn with the
simulator's own chain (exporter.sim.profiles), so acceptance along a step is correlated as in
vLLM. A request's counts and moments become visible at the first scrape after it completed.

promtool is asked, per route, how many evaluations had the alert firing and when it first
fired: each query expects nothing, so promtool prints what it got (nothing here re-implements
the rules). Used by tests/integration/test_alert_quality.py (the must-show figures, in CI) and
bench/alert_quality.py (the wider study, by hand).
"""

from __future__ import annotations

import functools
import random
import re
import subprocess
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from exporter.sim.profiles import Profile, draw

REPO = Path(__file__).resolve().parents[1]
RULES = sorted((REPO / "deploy" / "prometheus" / "rules").glob("*.yml"))
SCRAPE = 15  # seconds: prometheus.yml's scrape and evaluation interval
K = 3
MODEL = "sim-27b"
JOB = 'job="specdec", instance="127.0.0.1:10419"'
STEP_SECONDS = 1 / 40  # between a request's verify steps
Mean = Callable[[float], float]  # a route's mean acceptance at a time (seconds from the start)


@dataclass
class RouteTraffic:
    name: str
    per_minute: float  # requests completing per minute (Poisson)
    mean: Mean | float = 0.71
    concentration: float = 15.0
    kinds: tuple[tuple[Mean | float, Mean | float], ...] = ()  # (mean, share): prompt kinds
    steps: tuple[int, int] = (20, 120)  # verify steps of a request, uniform
    requests: list[tuple[float, int, float]] = field(default_factory=list)  # done, steps, p

    def mean_at(self, t: float, rng: random.Random) -> float:
        if self.kinds:
            means = [m for m, _ in self.kinds]
            weights = [w(t) if callable(w) else w for _, w in self.kinds]
            chosen = rng.choices(means, weights)[0]
            return chosen(t) if callable(chosen) else chosen
        return self.mean(t) if callable(self.mean) else self.mean


@dataclass(frozen=True)
class Scenario:
    name: str
    seconds: int
    routes: list[RouteTraffic]
    lag: float = 0.0  # a live server's worst case: a scrape sees a completion this much later


@functools.lru_cache(maxsize=8192)
def _chain(acceptance: float) -> tuple[float, ...]:
    return Profile("x", 0.5).conditional(K, acceptance)


def _requests(
    route: RouteTraffic, seconds: int, rng: random.Random
) -> Iterator[tuple[float, int, float, int]]:
    """(done, steps, per-request acceptance, accepted drafts) of each request."""
    t = 0.0
    while True:
        t += rng.expovariate(route.per_minute / 60)
        if t > seconds:
            return
        steps = rng.randint(*route.steps)
        mean = route.mean_at(t - steps * STEP_SECONDS, rng)
        c = route.concentration
        p = (
            mean
            if c == float("inf") or not 0 < mean < 1
            else rng.betavariate(mean * c, (1 - mean) * c)
        )
        chain = _chain(round(p, 3))  # 0.001 steps: the chain is solved once per value
        yield t, steps, p, sum(draw(rng, chain) for _ in range(steps))


def input_series(scenario: Scenario, seed: int) -> list[dict[str, str]]:
    """Cumulative counters at every scrape, as promtool input series."""
    rng = random.Random(seed)
    samples = scenario.seconds // SCRAPE + 1
    out = []
    for route in scenario.routes:
        per_scrape = {name: [0] * samples for name in ROUTE_COUNTERS}
        for done, steps, p, accepted in _requests(route, scenario.seconds, rng):
            route.requests.append((done, steps, p))
            i = int((done + scenario.lag) // SCRAPE) + 1
            if i >= samples:
                continue
            tokens = K * steps
            for name, value in (
                ("drafts", steps),
                ("draft_tokens", tokens),
                ("accepted", accepted),
                ("requests", 1),
                ("tt", tokens * tokens),
                ("aa", accepted * accepted),
                ("at", accepted * tokens),
                ("ttt", tokens**3),
            ):
                per_scrape[name][i] += value
        labels = f'route="{route.name}", model_name="{MODEL}", {JOB}'
        for name, (metric, extra) in ROUTE_COUNTERS.items():
            series = f"{metric}{{{labels}{extra}}}"
            out.append(
                {"series": series, "values": " ".join(map(str, _cumulative(per_scrape[name])))}
            )
    return out


ROUTE_COUNTERS = {  # per-request sums -> (family, extra labels): the route families the rules read
    "drafts": ("specdec_route_drafts_total", ', source="exact"'),
    "draft_tokens": ("specdec_route_draft_tokens_total", ', source="exact"'),
    "accepted": ("specdec_route_accepted_tokens_total", ', source="exact"'),
    "requests": ("specdec_route_spec_requests_total", ""),
    "tt": ("specdec_route_request_draft_tokens_squared_total", ""),
    "aa": ("specdec_route_request_accepted_tokens_squared_total", ""),
    "at": ("specdec_route_request_accepted_times_draft_tokens_total", ""),
    "ttt": ("specdec_route_request_draft_tokens_cubed_total", ""),
}


def _cumulative(increments: Iterable[int]) -> list[int]:
    total, out = 0, []
    for inc in increments:
        total += inc
        out.append(total)
    return out


def group_order(rules: list[Path], alerts_first: bool = False) -> list[str]:
    """Recording groups first (file order), alerts last: promtool otherwise picks at random.
    `alerts_first`: alerts read the recorded values one evaluation old (a live server's worst
    group offset)."""
    recording, alerting = [], []
    for path in rules:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            is_alert = any("alert" in rule for rule in group["rules"])
            (alerting if is_alert else recording).append(group["name"])
    return alerting + recording if alerts_first else recording + alerting


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def pruned_rules(roots: Iterable[str], into: Path, rules: list[Path] = RULES) -> list[Path]:
    """Copies of `rules` in `into` holding only the rules `roots` (alert names and recorded
    series) read, transitively, each verbatim and in its group and order: promtool's time over a
    day of samples goes mostly to evaluating rules, and a rule nothing asked reads cannot change
    an answer. An expression that reads ALERTS keeps every alert."""
    docs = [yaml.safe_load(path.read_text(encoding="utf-8")) for path in rules]
    every = [rule for doc in docs for group in doc["groups"] for rule in group["rules"]]
    recorded = {rule["record"]: rule["expr"] for rule in every if "record" in rule}
    alerts = {rule["alert"]: rule["expr"] for rule in every if "alert" in rule}
    wanted: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        wanted.add(name)
        expr = recorded.get(name) or alerts.get(name) or ""
        read = set(_NAME.findall(expr))
        todo += [n for n in read if n in recorded] + (list(alerts) if "ALERTS" in read else [])
    into.mkdir(parents=True, exist_ok=True)
    out = []
    for path, doc in zip(rules, docs, strict=True):
        groups = [
            {**group, "rules": kept}
            for group in doc["groups"]
            if (kept := [r for r in group["rules"] if {r.get("record"), r.get("alert")} & wanted])
        ]
        if groups:
            copy = into / path.name
            copy.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False), encoding="utf-8")
            out.append(copy)
    return out


def queries(alert: str, now: str) -> dict[str, str]:
    """What promtool is asked per route at the end of a run ({T}: the run's length)."""
    firing = f'ALERTS{{alertname="{alert}", alertstate="firing"}}'
    return {
        "firing": f"count_over_time({firing}[{{T}}s])",
        "first": f"min_over_time(timestamp({firing})[{{T}}s:{SCRAPE}s])",
        "min_now": f"min_over_time({now}[{{T}}s])",
    }


def promtool_file(
    scenario: Scenario, seed: int, asked: dict[str, str], rules: list[Path] = RULES
) -> str:
    end = scenario.seconds
    test = {
        "name": scenario.name,
        "interval": f"{SCRAPE}s",
        "input_series": input_series(scenario, seed),
        "promql_expr_test": [  # expect nothing, so promtool prints what it got
            {"expr": q.replace("{T}", str(end)), "eval_time": f"{end}s", "exp_samples": []}
            for q in asked.values()
        ],
    }
    doc = {
        "rule_files": [str(p) for p in rules],
        "evaluation_interval": f"{SCRAPE}s",
        "group_eval_order": group_order(rules, alerts_first=scenario.lag > 0),
        "tests": [test],
    }
    return yaml.safe_dump(doc, sort_keys=False, width=1 << 30)


_GOT = re.compile(r'^\s+expr: "(?P<expr>.*)", time: [^,]*,\s*$')
_SAMPLE = re.compile(r"\{(?P<labels>[^}]*)\} (?P<value>[-+0-9.eE]+|NaN)")


def run_promtool(promtool: str, path: Path, asked: dict[str, str]) -> dict[str, dict[str, float]]:
    """{query key: {route: value}} of what promtool got (it prints it as a failed test)."""
    proc = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, check=False
    )
    text = proc.stdout + proc.stderr
    if " err:" in text or ("SUCCESS" not in text and "FAILED" not in text):
        raise RuntimeError(f"promtool failed on {path}:\n{text[-3000:]}")
    by_expr = {re.sub(r"\[\{T\}s", "[T", q): key for key, q in asked.items()}
    got: dict[str, dict[str, float]] = {}
    key: str | None = None
    for line in text.splitlines():
        if match := _GOT.match(line):
            expr = match.group("expr").replace('\\"', '"')
            key = by_expr[re.sub(r"\[\d+s", "[T", expr)]
        elif key and line.strip().startswith("got:"):
            for sample in _SAMPLE.finditer(line.split("got:", 1)[1]):
                route = re.search(r'route="([^"]*)"', sample.group("labels"))
                assert route is not None, line
                got.setdefault(key, {})[route.group(1)] = float(sample.group("value"))
            key = None
    return got


def step(t0: float, before: float = 0.71, after: float = 0.36) -> Mean:
    """A mean acceptance that steps at t0."""
    return lambda t: before if t < t0 else after
