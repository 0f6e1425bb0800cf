"""`specdec advise`: from a running sidecar (or the Prometheus that scrapes it), per route the
payoff now, the best draft length and what switching speculation off would change; for today's
mix, a batch-size -> k schedule in the shape of vLLM's dynamic speculative decoding
(`num_speculative_tokens_per_batch_size` in its `--speculative-config`, as vLLM 0.32 reads it).

Everything is read from the sidecar's families (its windows, the engine's per-position
acceptance, the model's step-time line), off its /metrics or as Prometheus's latest samples of
one sidecar instance; nothing is re-measured. What it assumes is printed with it.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from exporter.core.payoff import (
    best_draft_length,
    linear_costs,
    speedups_by_draft_length,
)
from exporter.core.schedule import BadSchedule, Schedule
from exporter.verbs import EXIT_USAGE, AddVerb

EXIT_NO_DATA = 1
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
Labels = frozenset[tuple[str, str]]


def register(add_verb: AddVerb) -> None:
    p = add_verb(
        "advise",
        help="per route: the payoff now, the best draft length, a DSD schedule",
        description="Read a running sidecar's /metrics (or, with --prometheus, its latest "
        "samples there) and state, per route, the speedup at the "
        "load it runs (estimated and measured), the best draft length 0..k and what turning "
        "speculation off would change; for today's route mix, the draft length per batch-size "
        "range as vLLM's dynamic speculative decoding schedule, ready to merge into its "
        "--speculative-config (num_speculative_tokens_per_batch_size). Needs the model's "
        "step-time curve in the sidecar config (specdec measure --concurrency).",
    )
    p.add_argument(
        "--sidecar",
        default="http://127.0.0.1:10419",
        metavar="URL",
        help="the sidecar (default http://127.0.0.1:10419; its /metrics is read)",
    )
    p.add_argument(
        "--prometheus",
        metavar="URL",
        help="read the sidecar's latest samples from this Prometheus instead of --sidecar",
    )
    p.add_argument(
        "--instance",
        metavar="HOST:PORT",
        help="with --prometheus: which sidecar (its instance label) when it scrapes several",
    )
    p.add_argument("--window", default="5m", help="which of its windows (default 5m)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(run=run)


@dataclass
class Page:
    """The sidecar's samples by family name: [(labels, value)]."""

    samples: dict[str, list[tuple[dict[str, str], float]]] = field(
        default_factory=lambda: defaultdict(list)
    )

    def get(self, name: str, **match: str) -> list[tuple[dict[str, str], float]]:
        return [
            (labels, value)
            for labels, value in self.samples.get(name, [])
            if all(labels.get(k) == v for k, v in match.items())
        ]


# The families advise reads, as one selector for Prometheus.
FAMILIES = (
    "specdec_model_(plain|verify)_step_.*|specdec_model_step_curve_max_running_requests"
    "|specdec_position_acceptance_ratio"
    "|specdec_route_(estimated_speedup|speedup|speedup_at_draft_length)_ratio"
    "|specdec_route_speedup_at_draft_length_ci_halfwidth|specdec_route_best_draft_length"
)


class NoData(Exception):
    """What advise cannot read, said in one line (exit 1)."""


def read(url: str) -> Page:
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=10) as resp:
        return parse(resp.read().decode("utf-8", errors="replace"))


def parse(text: str) -> Page:
    """A sidecar's /metrics page as advise reads it."""
    page = Page()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            page.samples[s.name].append((dict(s.labels), s.value))
    return page


def read_prometheus(url: str, instance: str | None) -> Page:
    """The latest samples of one sidecar's families. A fleet's sidecars each see their own
    engine's batch and curve, so their gauges are not summed: one instance is read."""
    query = urllib.parse.urlencode({"query": f'{{__name__=~"{FAMILIES}"}}'})
    with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/query?{query}", timeout=10) as resp:
        answer = json.loads(resp.read())
    if answer.get("status") != "success":
        raise NoData(f"{url} refused the query: {answer.get('error', answer)}")
    result = answer["data"]["result"]
    instances = sorted({r["metric"].get("instance", "") for r in result})
    if instance is None and len(instances) > 1:
        raise NoData(f"{url} scrapes several sidecars; pick one with --instance: "
                     + ", ".join(instances))  # fmt: skip
    if instance is not None and instance not in instances:
        raise NoData(f"{url} has no sidecar samples from instance {instance!r}; it has: "
                     + (", ".join(instances) or "none"))  # fmt: skip
    page = Page()
    for r in result:
        labels = dict(r["metric"])
        if instance is not None and labels.get("instance") != instance:
            continue
        name = labels.pop("__name__")
        page.samples[name].append((labels, float(r["value"][1])))
    return page


def run(args: argparse.Namespace) -> int:
    source = args.prometheus or args.sidecar
    flag = "--prometheus" if args.prometheus else "--sidecar"
    if not source.startswith(("http://", "https://")):
        print(f"specdec advise: {flag} wants http(s)://HOST:PORT, got {source!r}",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    if args.instance and not args.prometheus:
        print("specdec advise: --instance goes with --prometheus", file=sys.stderr)
        return EXIT_USAGE
    try:
        page = read_prometheus(source, args.instance) if args.prometheus else read(source)
    except NoData as exc:
        print(f"specdec advise: {exc}", file=sys.stderr)
        return EXIT_NO_DATA
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        what = "/api/v1/query" if args.prometheus else "/metrics"
        print(f"specdec advise: cannot read {source}{what}: {exc}", file=sys.stderr)
        return EXIT_NO_DATA
    advice, problem = advise(page, args.window)
    if problem:
        print(f"specdec advise: {problem}", file=sys.stderr)
        return EXIT_NO_DATA
    print(json.dumps(advice, indent=2) if args.json else to_text(advice))
    return 0


def advise(page: Page, window: str) -> tuple[dict[str, Any], str | None]:
    """The advice document, or why there is none."""
    models = {
        labels["model_name"] for labels, _ in page.get("specdec_model_plain_step_base_seconds")
    }
    if not models:
        return {}, (
            "the sidecar has no step-time curve for any model: add `step_time` (specdec measure "
            "--concurrency 1,8,32 --baseline-url ...) to its models: config"
        )
    routes = _routes(page, window)
    if not routes:
        return {}, (
            f"no route has a full {window} window of traffic with a speedup yet (is traffic "
            "going through the proxy, and is the sidecar older than the window?)"
        )
    schedules = {model: _schedule(page, model, window) for model in sorted(models)}
    return {
        "window": window,
        "routes": routes,
        "dynamic_speculative_decoding": schedules,
        "assumes": [
            "the speedup is against a plain engine running the same batch (closed-loop clients)",
            "a step's seconds are read through the steps measure measured below k (llama.cpp: "
            "at 1 and k - 1 drafts) to the observed one at the configured k, linear between "
            "them and past k, else linear from a plain step",
            "a route's options stop at the configured k where its per-position acceptance is "
            "its own (vLLM, SGLang: nothing is known past k); a llama.cpp route's modelled "
            "profile goes 2 past it; the batch-size schedule never raises k",
            "the schedule uses the engine's per-position acceptance over the window: today's "
            "route mix",
        ],
    }, None


def _routes(page: Page, window: str) -> list[dict[str, Any]]:
    out = []
    for labels, estimated in page.get("specdec_route_estimated_speedup_ratio", window=window):
        route, model = labels["route"], labels["model_name"]
        key = {"route": route, "model_name": model, "window": window}
        measured = page.get("specdec_route_speedup_ratio", **key)
        lengths = {
            int(lb["draft_length"]): v
            for lb, v in page.get("specdec_route_speedup_at_draft_length_ratio", **key)
        }
        halves = {
            int(lb["draft_length"]): v
            for lb, v in page.get("specdec_route_speedup_at_draft_length_ci_halfwidth", **key)
        }
        best = page.get("specdec_route_best_draft_length", **key)
        out.append(
            {
                "route": route,
                "model_name": model,
                "speedup_estimated": estimated,
                "speedup_measured": measured[0][1] if measured else None,
                "by_draft_length": {k: [v, halves.get(k)] for k, v in sorted(lengths.items())},
                "best_draft_length": int(best[0][1]) if best else None,
                "speculation_off_changes_decode_by": 1 / estimated - 1 if estimated else None,
            }
        )
    return sorted(out, key=lambda r: str(r["route"]))


def _schedule(page: Page, model: str, window: str) -> dict[str, Any]:
    """The k per batch size for the model's mix: the engine's P(more than i accepted) over the
    window and the step-time line at each batch (itl: a step's seconds at k' drafts), up to
    the largest batch the curve was measured at: past it the line is a guess, so the advice
    stops there and says so."""

    def one(name: str) -> float | None:
        found = page.get(name, model_name=model)
        return found[0][1] if found else None

    plain0, plain1 = (
        one("specdec_model_plain_step_base_seconds"),
        one("specdec_model_plain_step_seconds_per_running_request"),
    )
    verify0, verify1 = (
        one("specdec_model_verify_step_base_seconds"),
        one("specdec_model_verify_step_seconds_per_running_request"),
    )
    positions = sorted(
        (int(lb["position"]), v)
        for lb, v in page.get(
            "specdec_position_acceptance_ratio", model_name=model, engine="all", window=window
        )
    )
    if plain0 is None or plain1 is None or verify0 is None or verify1 is None or not positions:
        return {"error": f"no per-position acceptance over {window} or no verify-step line"}
    measured = one("specdec_model_step_curve_max_running_requests")
    if measured is None:
        return {"error": "the sidecar does not say how far its step-time curve was measured"}
    last = max(1, round(measured))  # a mean batch: 7.98 at concurrency 8
    batches = sorted({b for b in BATCHES if b < last} | {last})
    per_position = tuple(v for _, v in positions)
    k = len(per_position)
    seconds: dict[int, dict[int, float]] = {}
    best_k: dict[int, int] = {}
    for b in batches:
        plain, verify = plain0 + plain1 * b, verify0 + verify1 * b
        costs = linear_costs(plain, verify, k, k)
        options = speedups_by_draft_length(per_position, 1.0, costs, 0.0)
        seconds[b] = {o.draft_length: plain * costs[o.draft_length] for o in options}
        chosen = best_draft_length(options)
        best_k[b] = chosen.draft_length if chosen else k
    advised = _ranges(best_k)
    return {
        "measured_up_to_running": last,
        "speculative_config": {
            "num_speculative_tokens": k,
            "num_speculative_tokens_per_batch_size": advised,
        },
        "configured": _configured(page, model, advised),
        "acceptance_rate_per_pos": list(per_position),
        "step_seconds_by_batch": seconds,
    }


def _configured(page: Page, model: str, advised: list[list[int]]) -> dict[str, Any] | None:
    """The schedule the sidecar's config says the engine runs (its `draft_length_schedule`),
    and whether it gives the advised k at every batch the advice covers (None: none
    configured)."""
    ranges = sorted(
        [int(lb["first_batch"]), int(lb["last_batch"]), int(v)]
        for lb, v in page.get("specdec_model_schedule_range_draft_length", model_name=model)
    )
    if not ranges:
        return None
    try:
        configured = Schedule.parse(ranges)
    except BadSchedule:
        return None
    wanted = Schedule.parse(advised)
    last = advised[-1][1]
    differ = [b for b in range(1, last + 1) if configured.draft_length(b) != wanted.draft_length(b)]
    return {"num_speculative_tokens_per_batch_size": ranges, "matches": not differ,
            "first_batch_differing": differ[0] if differ else None}  # fmt: skip


def _ranges(best: dict[int, int]) -> list[list[int]]:
    """{1: 3, 2: 3, 4: 2, ..., 256: 0} -> [[1, 3, 3], [4, 255, 2], [256, 256, 0]]: vLLM's
    `num_speculative_tokens_per_batch_size`, inclusive batch-size ranges from 1, one per run
    of equal k (vLLM carries the last k on to its max_num_seqs)."""
    sizes = sorted(best)
    out: list[list[int]] = []
    for i, b in enumerate(sizes):
        end = sizes[i + 1] - 1 if i + 1 < len(sizes) else b
        if out and out[-1][2] == best[b]:
            out[-1][1] = end
        else:
            out.append([b, end, best[b]])
    return out


def to_text(advice: dict[str, Any]) -> str:
    lines = [f"over the last {advice['window']}:"]
    for r in advice["routes"]:
        est, meas = r["speedup_estimated"], r["speedup_measured"]
        line = f"  {r['route']} ({r['model_name']}): speedup x{est:.2f} at the load it runs"
        if meas is not None:
            line += f" (decode rate says x{meas:.2f})"
        lines.append(line)
        if est:
            off = r["speculation_off_changes_decode_by"]
            lines.append(f"    speculation off: decode {off:+.0%}")
        lengths = ", ".join(
            f"k={k}: x{v:.2f}" + (f" ±{h:.2f}" if h is not None else "")
            for k, (v, h) in r["by_draft_length"].items()
        )
        if lengths:
            lines.append(f"    by draft length: {lengths}")
        best = r["best_draft_length"]
        lines.append(
            f"    best draft length: {best}"
            if best is not None
            else "    best draft length: not told apart from the runner-up yet (more traffic)"
        )
    for model, sched in advice["dynamic_speculative_decoding"].items():
        lines.append(f"\n{model}: draft length by batch size for today's mix")
        if "error" in sched:
            lines.append(f"  {sched['error']}")
            continue
        config = sched["speculative_config"]
        for start, end, k in config["num_speculative_tokens_per_batch_size"]:
            lines.append(f"  running {start}-{end}: k = {k}")
        last = sched["measured_up_to_running"]
        lines.append(
            f"  running above {last}: not advised (the step-time curve was measured up to "
            f"{last} running; measure --concurrency up to the engine's max_num_seqs first)"
        )
        lines.append(
            "  merge into vLLM's --speculative-config (as vLLM 0.32 reads it; it holds the last "
            f"k above {last}; ignored with data parallel > 1):"
        )
        lines.append("  " + json.dumps(config))
        mine = sched.get("configured")
        if mine is not None:
            said = json.dumps(mine["num_speculative_tokens_per_batch_size"])
            lines.append(
                f"  the config's draft_length_schedule {said} already matches this"
                if mine["matches"]
                else f"  the config's draft_length_schedule {said} differs from this from batch "
                f"{mine['first_batch_differing']} on"
            )
    lines.append("\nassumes: " + "; ".join(advice["assumes"]))
    return "\n".join(lines)
