"""Build the Grafana dashboards: JSON next to the sources, a check for CI, PNG previews.

    python -m dashboards.build                  # write dashboards/<uid>.json
    python -m dashboards.build --check          # exit 1 listing the files that differ
    python -m dashboards.build --preview DIR --prometheus http://127.0.0.1:9090
                                                # one PNG per dashboard, live query results

The preview needs matplotlib (optional). It lays each panel out in its gridPos and plots its
queries' live results with the dashboard variables substituted (`$job` and the other
variables: `--var NAME=REGEX`, default `.*`; `$__rate_interval`: 1m; `$__interval`: 15s;
`$__range`: the preview's `--range`), so a reviewer without Grafana sees what users will see.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from dashboards import engine, health, payoff
from dashboards.live import PrometheusError, prometheus_query
from dashboards.panels import JSON, to_json
from dashboards.preview import preview
from exporter.core.durations import parse_duration

DIRECTORY = Path(__file__).resolve().parent
BUILDERS: dict[str, Callable[[], Any]] = {
    payoff.UID: payoff.build,
    engine.UID: engine.build,
    health.UID: health.build,
}
EXIT_OK, EXIT_STALE, EXIT_USAGE = 0, 1, 2


def dashboards() -> dict[str, JSON]:
    """uid -> normalised dashboard JSON, in a fixed order."""
    return {uid: to_json(build()) for uid, build in BUILDERS.items()}


def render(data: JSON) -> str:
    """Stable text: sorted keys, two-space indent, final newline."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write(directory: Path = DIRECTORY, check: bool = False) -> list[Path]:
    """Write `<uid>.json` under `directory`; return the files that were (or, with `check`,
    would be) changed, including `specdec-*.json` files no dashboard produces any more."""
    wanted = {directory / f"{uid}.json": render(data) for uid, data in dashboards().items()}
    stale = [
        path
        for path, text in wanted.items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]
    extra = sorted(set(directory.glob("specdec-*.json")) - set(wanted))
    if not check:
        for path in stale:
            path.write_text(wanted[path], encoding="utf-8")
        for path in extra:
            path.unlink()
    return stale + extra


# --- command line --------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specdec dashboards",
        description="Write the Grafana dashboards (dashboards/<uid>.json) from their grafanalib "
        "sources; --check compares instead of writing; --preview renders PNGs from a live "
        "Prometheus.",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 listing the JSON files that differ from the sources",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=DIRECTORY,
        metavar="DIR",
        help=f"where the JSON goes (default: next to the sources, {DIRECTORY})",
    )
    p.add_argument(
        "--preview",
        type=Path,
        metavar="DIR",
        help="render one PNG per dashboard into DIR (needs matplotlib and --prometheus)",
    )
    p.add_argument(
        "--prometheus",
        default="http://127.0.0.1:9090",
        metavar="URL",
        help="Prometheus to query for --preview (default http://127.0.0.1:9090)",
    )
    p.add_argument(
        "--range",
        default="1h",
        metavar="DURATION",
        help="time range of the preview's time series, e.g. 15m, 1h (default 1h)",
    )
    p.add_argument(
        "--var",
        action="append",
        default=[],
        metavar="NAME=REGEX",
        help="a dashboard variable's value for --preview, e.g. job=specdec (default .*, All)",
    )
    return p


def _variables(pairs: Sequence[str]) -> dict[str, str]:
    values = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"--var wants NAME=REGEX, got {pair!r}")
        values[name] = value
    return values


def _previews(args: argparse.Namespace) -> Iterator[Path]:
    values = _variables(args.var)
    range_s = parse_duration(args.range)
    try:
        prometheus_query(args.prometheus, "status/buildinfo", {}, timeout=5)
    except PrometheusError as exc:
        raise PrometheusError(f"cannot query Prometheus at {args.prometheus} ({exc})") from exc
    now = time.time()
    for data in dashboards().values():
        yield preview(data, args.prometheus, args.preview, values, range_s, now)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.preview is not None:
        try:
            import matplotlib  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            print(
                "specdec dashboards --preview needs matplotlib: pip install matplotlib "
                "(or the project's test extra)",
                file=sys.stderr,
            )
            return EXIT_USAGE
        matplotlib.use("Agg")
        try:
            for path in _previews(args):
                print(f"wrote {path}")
        except (PrometheusError, ValueError) as exc:
            print(f"specdec dashboards --preview: {exc}", file=sys.stderr)
            return EXIT_USAGE
        return EXIT_OK
    changed = write(args.out, check=args.check)
    if args.check:
        for path in changed:
            print(f"{path}: differs from the dashboard sources; run `specdec dashboards`")
        return EXIT_STALE if changed else EXIT_OK
    for path in changed:
        print(f"wrote {path}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
