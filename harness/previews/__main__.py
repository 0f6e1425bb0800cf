"""`python3 -m harness.previews DIR --prometheus URL`: one PNG per dashboard under DIR, from a
live Prometheus' answers, as Grafana would draw them (`make previews` runs the tests' live
stack through a scripted acceptance drop first: tests/integration/render_previews.py).

The dashboard variables are substituted (`$job` and the others: NAME=REGEX, default `.*`;
`$__rate_interval`: 1m; `$__interval`: 15s; `$__range`: the preview's range)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from dashboards.boards.build import dashboards
from dashboards.config import DEFAULT, Mixin, load
from exporter.config import ConfigError
from exporter.core.durations import parse_duration
from harness.previews.live import PrometheusError, prometheus_query
from harness.previews.render import preview

EXIT_USAGE = 2


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


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m harness.previews",
        description="Render one PNG per Grafana dashboard (DIR/<uid>.png) from a live "
        "Prometheus, without Grafana. Needs matplotlib (the plot extra).",
    )
    p.add_argument("out", type=Path, metavar="DIR", help="where the PNGs go")
    p.add_argument(
        "--prometheus",
        default="http://127.0.0.1:9090",
        metavar="URL",
        help="the Prometheus to query (default http://127.0.0.1:9090)",
    )
    p.add_argument(
        "--range",
        default="1h",
        metavar="DURATION",
        help="time range of the time series, e.g. 15m, 1h (default 1h)",
    )
    p.add_argument(
        "--var",
        action="append",
        default=[],
        metavar="NAME=REGEX",
        help="a dashboard variable's value, e.g. job=specdec (default .*, All)",
    )
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="the mixin config the dashboards were generated with (docs/mixin.md)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        import matplotlib  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        print("previews: needs matplotlib: pip install -e '.[plot]'", file=sys.stderr)
        return EXIT_USAGE
    try:
        mix = DEFAULT if args.config is None else load(args.config)
        values, range_s = variables(args.var), parse_duration(args.range)
        for path in previews(args.prometheus, args.out, values, range_s, mix):
            print(f"wrote {path}")
    except ConfigError as exc:
        print("\n".join(f"previews: config error: {m}" for m in exc.messages), file=sys.stderr)
        return EXIT_USAGE
    except (PrometheusError, ValueError) as exc:
        print(f"previews: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return 0


if __name__ == "__main__":
    sys.exit(main())
