"""A fleet on Prometheus's own distributed path at scale: what the global Prometheus pays.

harness/fleet.py's fleet: --replicas simulated engines (two models, `specdec sim`), each with
its own sidecar and proxy (`specdec serve`), two regional Prometheus servers in agent mode each
scraping half of them (jobs specdec and vllm, every --scrape) and remote-writing to one global
Prometheus that evaluates the shipped rules and alerts (deploy/prometheus/rules/*.yml, at
their own 15 s and 1 m). Traffic: one client per replica through its proxy, both routes in the
replica's own mix, --rate requests a second each. After --warmup, over --seconds:

    series      in the global Prometheus (its head), per replica (the sidecar's and vLLM's
                pages with the scrape's own series), recorded by the rules, and the breakdown's
                share (`specdec_route_slice_*`, `specdec_route_acceptance_change_ratio` and the
                rules over them): "off" is the count without them, what a `metric_relabel_configs`
                drop of those families leaves
    rules       each group's evaluation time (prometheus_rule_group_last_duration_seconds,
                the last one and the largest seen) and its interval
    scrapes     scrape_duration_seconds per job, as the agents wrote it (mean and max)
    CPU         as a share of one core: each sidecar's (specdec_process_cpu_seconds_total;
                mean, max), the global Prometheus's and the agents'

The sidecars' windows are 20s, 40s, 60s (three, as the default 1m, 5m, 15m: the same series,
full within the run). On a small host keep --rate low: 64 Python processes share its cores.

    python3 bench/fleet.py                       # 32 replicas, ~5 min
    python3 bench/fleet.py --replicas 8 --seconds 60 --record
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _run import add_outputs, guarded, keep  # noqa: E402

from harness.fleet import Fleet, Traffic, fleet, layout  # noqa: E402
from harness.helpers import wait_for  # noqa: E402

RULES = sorted((REPO / "deploy/prometheus/rules").glob("*.yml"))
BREAKDOWN = "specdec_route_slice_.+|specdec_route_acceptance_change_ratio"
BREAKDOWN_RECORDED = ".+:specdec_route_(slice|acceptance_change).*"
RECORDED = ".+:.+:.+"  # level:metric:operations (vLLM's own names have one colon)


def scalar(f: Fleet, promql: str) -> float | None:
    found = f.query(promql)
    return float(found[0]["value"][1]) if found else None


def per_pod(f: Fleet, promql: str) -> list[float]:
    return [float(s["value"][1]) for s in f.query(promql)]


def own_metric(url: str, name: str) -> dict[str, float]:
    """A Prometheus server's own /metrics: `name`'s samples by their label text."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    found = {}
    for line in text.splitlines():
        m = re.match(rf"{re.escape(name)}(\{{[^}}]*\}})? ([-+0-9.eE]+|NaN)$", line)
        if m:
            found[m.group(1) or ""] = float(m.group(2))
    return found


def group_of(labels: str) -> str:
    m = re.search(r'rule_group="[^"]*;([^"]+)"', labels)
    return m.group(1) if m else labels


def stats(values: list[float], digits: int = 4) -> dict[str, float]:
    if not values:
        return {}
    return {
        "mean": round(statistics.fmean(values), digits),
        "max": round(max(values), digits),
    }


def scrape_seconds(f: Fleet, job: str, window: str) -> dict[str, float]:
    """A job's scrape durations over the window, as the agents measured and wrote them."""
    found = f'scrape_duration_seconds{{job="{job}"}}[{window}]'
    mean = scalar(f, f"avg(avg_over_time({found}))") or 0.0
    most = scalar(f, f"max(max_over_time({found}))") or 0.0
    return {"mean_s": round(mean, 4), "max_s": round(most, 4)}


def series(f: Fleet, n: int) -> dict[str, Any]:
    """Series in the global Prometheus: its head, per replica (sidecar job, vLLM job, and
    the breakdown's part of the sidecar's), recorded, and the total without the breakdown."""
    head = own_metric(f.prometheus, "prometheus_tsdb_head_series")[""]
    sidecar = per_pod(f, 'count by (pod) ({job="specdec"})')
    vllm = per_pod(f, 'count by (pod) ({job="vllm"})')
    breakdown = per_pod(f, f'count by (pod) ({{__name__=~"{BREAKDOWN}"}})')
    recorded = scalar(f, f'count({{__name__=~"{RECORDED}"}})') or 0.0
    per_replica = scalar(f, f'count({{__name__=~"{RECORDED}", pod!=""}})') or 0.0
    recorded_breakdown = scalar(f, f'count({{__name__=~"{BREAKDOWN_RECORDED}"}})') or 0.0
    alerts = scalar(f, 'count({__name__="ALERTS"})') or 0.0
    assert len(sidecar) == n, f"{len(sidecar)} of {n} replicas have series"
    off = head - sum(breakdown) - recorded_breakdown
    return {
        "global_head": int(head),
        "global_head_breakdown_off": int(off),
        "per_replica_sidecar": stats(sidecar, 1),
        "per_replica_vllm": stats(vllm, 1),
        "per_replica_breakdown": stats(breakdown, 1),
        "per_replica_breakdown_off": round(
            statistics.fmean(sidecar) - statistics.fmean(breakdown), 1
        ),
        "recorded": int(recorded),
        "recorded_per_replica": int(per_replica),  # none: the rules aggregate replicas away
        "recorded_breakdown": int(recorded_breakdown),
        "alerts": int(alerts),
    }


def summary(found: dict[str, Any]) -> dict[str, Any]:
    """The run as one table (docs/BENCHMARKS.md renders it; the detail stays in the file)."""
    sr, cpu = found["series"], found["cpu_share_of_one_core"]
    side, engine = found["scrape_duration"]["specdec"], found["scrape_duration"]["vllm"]
    mean = {k: sr[f"per_replica_{k}"]["mean"] for k in ("sidecar", "breakdown", "vllm")}
    rule, cost = next(iter(found["costliest_rules_s"].items()))
    groups = "; ".join(
        f"{name.removeprefix('specdec-')} {1000 * g['last_s']:.0f} ms / {g['interval_s']:g} s"
        + (f" ({rule} {1000 * cost:.0f} ms)" if name == "specdec-route_model_name" else "")
        for name, g in found["rule_groups"].items()
    )
    each = cpu["sidecar_per_replica"]
    rows = [
        [
            "series at the global Prometheus",
            f"{sr['global_head']:,} ({sr['global_head_breakdown_off']:,} breakdown off)",
        ],
        [
            "a replica's series (mean)",
            f"sidecar {mean['sidecar']:.0f} (breakdown {mean['breakdown']:.0f}), "
            f"vLLM page {mean['vllm']:.0f}",
        ],
        [
            "recorded by the rules",
            f"{sr['recorded']:,} (with a replica's labels: {sr['recorded_per_replica']})",
        ],
        ["rule groups, last evaluation / interval", groups],
        [
            "scrape duration, mean / max",
            f"sidecar {1000 * side['mean_s']:.0f} / {1000 * side['max_s']:.0f} ms, "
            f"vLLM {1000 * engine['mean_s']:.0f} / {1000 * engine['max_s']:.0f} ms",
        ],
        [
            "CPU, share of one core",
            f"sidecar {100 * each['mean']:.2f} % each (max {100 * each['max']:.2f} %), "
            f"global Prometheus {100 * cpu['global_prometheus']:.1f} %, "
            f"agents {100 * cpu['agents_each']['mean']:.1f} % each",
        ],
    ]
    title = (
        f"{found['replicas']} replicas of 2 models, 2 regional agents scraping every "
        f"{found['scrape_interval']}, one global Prometheus with the shipped rules; "
        f"{found['requests_per_second']:g} requests/s, {found['failed_requests']} failed"
    )
    return {"title": title, "columns": ["", "figure"], "rows": rows}


def run(args: argparse.Namespace) -> int:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        raise RuntimeError("needs Debian's prometheus (apt-get install prometheus)")
    replicas = layout(args.replicas)
    with tempfile.TemporaryDirectory(prefix="specdec-fleet-") as tmp:
        started = time.monotonic()
        with (
            fleet(
                Path(tmp),
                replicas,
                RULES,
                prometheus,
                speed=args.speed,
                scrape=args.scrape,
                evaluation="15s",
                windows="20s, 40s, 60s",
            ) as f,
            Traffic(replicas, pace=1 / args.rate) as traffic,
        ):
            up = time.monotonic() - started
            print(f"{args.replicas} replicas up in {up:.0f} s; warming up {args.warmup:.0f} s")
            t0 = time.monotonic()
            wait_for(lambda: time.monotonic() - t0 >= args.warmup, args.warmup + 5, "warm-up")
            requests0 = sum(traffic.requests.values())
            global0 = own_metric(f.prometheus, "process_cpu_seconds_total")[""]
            agents0 = [own_metric(a, "process_cpu_seconds_total")[""] for a in f.agents]
            t1 = time.monotonic()
            print(f"measuring {args.seconds:.0f} s")
            wait_for(lambda: time.monotonic() - t1 >= args.seconds, args.seconds + 5, "the run")
            span = time.monotonic() - t1
            requests = sum(traffic.requests.values()) - requests0
            global_cpu = own_metric(f.prometheus, "process_cpu_seconds_total")[""] - global0
            agents_cpu = [
                own_metric(a, "process_cpu_seconds_total")[""] - c0
                for a, c0 in zip(f.agents, agents0, strict=True)
            ]
            window = f"{int(span)}s"
            cpu = f'rate(specdec_process_cpu_seconds_total{{job="specdec"}}[{window}])'
            sidecar_cpu = per_pod(f, cpu)
            scrapes = {job: scrape_seconds(f, job, window) for job in ("specdec", "vllm")}
            last = own_metric(f.prometheus, "prometheus_rule_group_last_duration_seconds")
            intervals = own_metric(f.prometheus, "prometheus_rule_group_interval_seconds")
            rules = {
                group_of(k): {"last_s": round(v, 4), "interval_s": intervals.get(k)}
                for k, v in sorted(last.items())
            }
            costliest = sorted(
                (
                    (r["evaluationTime"], r["name"])
                    for g in f.api("rules")["groups"]
                    for r in g["rules"]
                ),
                reverse=True,
            )[:3]
            counted = series(f, args.replicas)
            failures = len(traffic.failures)
    found: dict[str, Any] = {
        "replicas": args.replicas,
        "scrape_interval": args.scrape,
        "requests_per_second": round(requests / span, 2),
        "failed_requests": failures,
        "series": counted,
        "rule_groups": rules,
        "costliest_rules_s": {name: round(t, 4) for t, name in costliest},
        "scrape_duration": scrapes,
        "cpu_share_of_one_core": {
            "sidecar_per_replica": stats(sidecar_cpu),
            "global_prometheus": round(global_cpu / span, 4),
            "agents_each": stats([c / span for c in agents_cpu]),
        },
    }
    figures = {"tables": [summary(found)], "reports": found}  # the detail: in the file
    print(figures)
    keep(args, "fleet", figures)
    return 0 if failures == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=32, help="engines (default 32)")
    parser.add_argument(
        "--rate", type=float, default=0.5, help="requests a second per replica (default 0.5)"
    )
    parser.add_argument("--speed", type=float, default=10.0, help="the simulators' (default 10)")
    parser.add_argument("--scrape", default="15s", help="the agents' interval (default 15s)")
    parser.add_argument(
        "--warmup", type=float, default=90.0, help="seconds before measuring (default 90)"
    )
    parser.add_argument("--seconds", type=float, default=180.0, help="measured (default 180)")
    add_outputs(parser)
    return guarded("fleet", run, parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
