"""Build the Grafana dashboards: JSON next to the sources, a check for CI, PNG previews.
The command line is `specdec dashboards` (dashboards/cli.py).

The preview needs matplotlib (optional). It lays each panel out in its gridPos and plots its
queries' live results with the dashboard variables substituted (`$job` and the other
variables: NAME=REGEX, default `.*`; `$__rate_interval`: 1m; `$__interval`: 15s; `$__range`:
the preview's range), so a reviewer without Grafana sees what users will see.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from dashboards import engine, health, payoff, requests
from dashboards.encode import to_json
from dashboards.live import PrometheusError, prometheus_query
from dashboards.mixin import DEFAULT, Mixin
from dashboards.panels import JSON
from dashboards.preview import preview

DIRECTORY = Path(__file__).resolve().parent
BUILDERS: tuple[Callable[[Mixin], Any], ...] = (
    payoff.build,
    requests.build,
    engine.build,
    health.build,
)


def dashboards(mix: Mixin = DEFAULT) -> dict[str, JSON]:
    """uid -> normalised dashboard JSON, in a fixed order."""
    built = [to_json(build(mix)) for build in BUILDERS]
    return {str(data["uid"]): data for data in built}


def render(data: JSON) -> str:
    """Stable text: sorted keys, two-space indent, final newline."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write(directory: Path = DIRECTORY, check: bool = False, mix: Mixin = DEFAULT) -> list[Path]:
    """Write `<uid>.json` under `directory`; return the files that were (or, with `check`,
    would be) changed, including `<prefix>-*.json` files no dashboard produces any more."""
    wanted = {directory / f"{uid}.json": render(data) for uid, data in dashboards(mix).items()}
    stale = [
        path
        for path, text in wanted.items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]
    extra = sorted(set(directory.glob(f"{mix.dashboards.uid_prefix}-*.json")) - set(wanted))
    if not check:
        for path in stale:
            path.write_text(wanted[path], encoding="utf-8")
        for path in extra:
            path.unlink()
    return stale + extra


def variables(pairs: Sequence[str]) -> dict[str, str]:
    """NAME=REGEX pairs -> {name: regex}; ValueError for a pair without `=`."""
    values = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"--var wants NAME=REGEX, got {pair!r}")
        values[name] = value
    return values


def previews(
    prometheus: str, out: Path, values: dict[str, str], range_s: float, mix: Mixin = DEFAULT
) -> Iterator[Path]:
    """One PNG per dashboard under `out`, from `prometheus`' live answers (matplotlib's Agg)."""
    import matplotlib  # type: ignore[import-not-found,unused-ignore]

    matplotlib.use("Agg")
    try:
        prometheus_query(prometheus, "status/buildinfo", {}, timeout=5)
    except PrometheusError as exc:
        raise PrometheusError(f"cannot query Prometheus at {prometheus} ({exc})") from exc
    now = time.time()
    for data in dashboards(mix).values():
        yield preview(data, prometheus, out, values, range_s, now)
