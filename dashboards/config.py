"""The mixin config: what a Prometheus/Grafana setup may need to change in the generated rules,
alerts and dashboards (job names and selectors, thresholds, windows, `for` durations, the
runbook URL, the dashboards' uid prefix, tags and data source), in one YAML file, as
kubernetes-mixin's config.libsonnet does. The defaults produce the committed files byte for
byte; `specdec rules --config FILE` and `specdec dashboards --config FILE` produce a user's.

    sidecar_job: vllm-sidecar
    acceptance_drop: {fraction: 0.35}
    runbook_url: https://wiki.example.com/specdec/runbooks.md
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from exporter.config.nodes import Check, Reader, compose, number, whole
from exporter.config.schema import DEFAULT_KIND, read, setting
from exporter.core.durations import parse_duration

NAMES = ("payoff", "requests", "engine", "health")  # the dashboards, uid <prefix>-<name>
UID_MAX = 40


def _duration(r: Reader, node: yaml.Node, key: str) -> str:
    text = r.scalar(node, key, str, "a duration such as 1m")
    r.window(text, node, key)  # the same grammar and checks as the sidecar's windows
    return text


def _durations(r: Reader, node: yaml.Node, key: str) -> tuple[str, ...]:
    return tuple(w.label for w in r.windows(node, key))


def _label_value(r: Reader, node: yaml.Node, key: str) -> str:
    return r.name(node, key)


def _uid_prefix(r: Reader, node: yaml.Node, key: str) -> str:
    prefix = r.name(node, key)
    longest = max(len(name) for name in NAMES) + 1
    if len(prefix) + longest > UID_MAX:  # Grafana refuses longer uids
        raise r.fail(node, key, f"at most {UID_MAX - longest} characters, got {len(prefix)}")
    return prefix


_MATCHER = r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(?:=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*'
MATCHERS = re.compile(rf"{_MATCHER}(?:,{_MATCHER})*,?\s*")


def _selector(r: Reader, node: yaml.Node, key: str) -> str:
    """Label matchers as inside PromQL's braces, `job="vllm", namespace=~"llm-.*"`; "" = any."""
    if not isinstance(node, yaml.ScalarNode):
        raise r.fail(node, key, 'expected label matchers such as job="vllm"')
    text = str(node.value).strip()
    if text and not MATCHERS.fullmatch(text):
        raise r.fail(node, key, f'expected label matchers such as job="vllm", got {text!r}')
    return text


def _tags(r: Reader, node: yaml.Node, key: str) -> tuple[str, ...]:
    return tuple(r.text(n, f"{key}[{i}]") for i, n in enumerate(r.sequence(node, key)))


def _url(r: Reader, node: yaml.Node, key: str) -> str:
    return r.check_url(r.text(node, key), node, key, "http(s)://HOST/PATH").rstrip("#")


@dataclass(frozen=True, slots=True)
class DropAlert:
    """SpecDecodeAcceptanceDrop: windows (short for busy routes, long for quiet ones), the
    relative floor, the z-score, the requests a window needs, and the requests the route's
    day needs before it is a level to fall from (a new route, model or Prometheus: its first
    few requests make a level and a spread too unsteady to judge against)."""

    windows: tuple[str, ...] = setting(_durations, ("1m", "10m"))
    fraction: float = setting(number(0.01, 0.99), 0.3)
    z: float = setting(number(1.0, 100.0), 4.5)
    min_requests: int = setting(whole(2, 10_000), 5)
    min_baseline_requests: int = setting(whole(2, 1_000_000), 100)


@dataclass(frozen=True, slots=True)
class Breakdown:
    """The acceptance change split into mix and within: its window against the baseline before
    it (the sidecar's `breakdown:`; the drop alert's longer window and its day), and the
    smallest part the dashboards draw (a dimension of one band moves no traffic: its mix part
    is 0, a line that says nothing)."""

    window: str = setting(_duration, "10m")
    baseline: str = setting(_duration, "1d")
    min_part: float = setting(number(0.0, 0.5), 0.005)


@dataclass(frozen=True, slots=True)
class RunawayAlert:
    """SpecDecodeRunawayGenerations (and the window of SpecDecodeAcceptanceCollapsed)."""

    window: str = setting(_duration, "10m")
    share: float = setting(number(0.0001, 1.0), 0.05)
    over_baseline: float = setting(number(1.0, 1000.0), 3.0)
    min_loops: int = setting(whole(1, 10_000), 3)


@dataclass(frozen=True, slots=True)
class CollapsedAlert:
    """SpecDecodeAcceptanceCollapsed."""

    share: float = setting(number(0.01, 1.0), 0.3)
    baseline: float = setting(number(0.0, 1.0), 0.1)
    normal_acceptance: float = setting(number(0.0, 1.0), 0.3)


@dataclass(frozen=True, slots=True)
class Durations:
    """`for:` of the alerts that wait (the request-level ones need none)."""

    below_breakeven: str = setting(_duration, "15m")
    costly_at_load: str = setting(_duration, "10m")
    silently_off: str = setting(_duration, "10m")
    schedule_not_in_effect: str = setting(_duration, "10m")
    exact_counts_lost: str = setting(_duration, "10m")
    counters_missing: str = setting(_duration, "10m")
    target_down: str = setting(_duration, "2m")
    exporter_down: str = setting(_duration, "2m")
    attribution_coverage: str = setting(_duration, "15m")
    curve_stale: str = setting(_duration, "15m")


@dataclass(frozen=True, slots=True)
class Dashboards:
    uid_prefix: str = setting(_uid_prefix, "specdec")
    tags: tuple[str, ...] = setting(_tags, ("specdec", "speculative-decoding", DEFAULT_KIND))
    datasource: str = setting(_label_value, "specdec-prometheus")  # the provisioned uid


def _object(cls: type) -> Check:
    return lambda r, node, key: read(r, cls, node, key)


@dataclass(frozen=True, slots=True)
class Mixin:
    sidecar_job: str = setting(_label_value, "specdec")  # the job scraping the sidecar
    vllm_job: str = setting(_label_value, DEFAULT_KIND)  # the job scraping vLLM itself
    # label matchers for vLLM's own series in alerts ("": any job, as prometheus.yml has one)
    vllm_selector: str = setting(_selector, "")
    # likewise for TensorRT-LLM's own /prometheus/metrics (SpecDecodeSilentlyOff's third half)
    trtllm_selector: str = setting(_selector, "")
    acceptance_drop: DropAlert = setting(_object(DropAlert), DropAlert())
    breakdown: Breakdown = setting(_object(Breakdown), Breakdown())
    runaway: RunawayAlert = setting(_object(RunawayAlert), RunawayAlert())
    collapsed: CollapsedAlert = setting(_object(CollapsedAlert), CollapsedAlert())
    min_requests_5m: int = setting(whole(1, 10_000), 6)  # SpecDecodeBelowBreakEven's guard
    coverage_min: float = setting(number(0.0, 1.0), 0.9)
    for_: Durations = setting(_object(Durations), Durations(), key="for")
    runbook_url: str = setting(
        _url, "https://github.com/specdec/specdec/blob/main/docs/runbooks.md"
    )
    dashboards: Dashboards = setting(_object(Dashboards), Dashboards())

    @property
    def sidecar_selector(self) -> str:
        return f'job="{self.sidecar_job}"'

    def runbook(self, alert: str) -> str:
        return f"{self.runbook_url}#{alert.lower()}"

    def uid(self, name: str) -> str:
        return f"{self.dashboards.uid_prefix}-{name}"


DEFAULT = Mixin()


def seconds(window: str) -> int:
    return int(parse_duration(window))


def load(path: str | Path) -> Mixin:
    """A mixin config file; ConfigError (every error in it, file:line:key each)."""
    root = compose(path)
    if root is None:
        return DEFAULT
    reader = Reader(str(path))
    mixin = read(reader, Mixin, root, "")
    reader.raise_errors()
    return mixin
