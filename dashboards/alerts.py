"""Alerts on speculative decoding, judged on request-level evidence so a quiet route or a
few unusual requests never cry wolf.

Each alert links to its section of docs/runbooks.md. Thresholds, windows, `for` durations and
job names come from the mixin config (dashboards/config.py), once.
bench/alert_quality.py measures the drop alert's detection time and false firings.
"""

from __future__ import annotations

from typing import Any

from dashboards.config import Mixin
from dashboards.queries import slices
from dashboards.queries.moments import (
    replica_drop,
    replica_relative_drop,
    replica_requests,
    rule_name,
)
from dashboards.queries.spec import ROUTES


def _alert(
    mix: Mixin,
    name: str,
    expr: str,
    for_: str,
    severity: str,
    summary: str,
    description: str,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity, **(labels or {})},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": mix.runbook(name),
        },
    }


def acceptance_drop(mix: Mixin) -> dict[str, Any]:
    drop = mix.acceptance_drop
    p0 = rule_name("exact_acceptance", "ratio_rate", "1d")
    windows = []
    for w in drop.windows:
        p = rule_name("exact_acceptance", "ratio_rate", w)
        windows.append(
            f"(\n  ({p0} - on (route, model_name) {p}) / on (route, model_name) {p0} > {drop.fraction}\n"
            f"  and on (route, model_name) {rule_name('acceptance_drop', 'zscore_rate', w)} > {drop.z}\n"
            f"  and on (route, model_name) {rule_name('spec_requests', 'increase', w)} >= {drop.min_requests}\n)"
        )
    for w in drop.windows:  # one replica's drop, which the fleet's figure may not show
        per_replica = replica_drop(w, drop.fraction, drop.z, drop.min_requests)
        windows.append(f"max by (route, model_name) (\n{per_replica}\n)")
    day = rule_name("spec_requests", "increase", "1d")
    return _alert(
        mix,
        "SpecDecodeAcceptanceDrop",
        "(\n" + "\nor\n".join(windows) + "\n)\n"
        f"and on (route, model_name) {day} >= {drop.min_baseline_requests}",
        "0s",
        "warning",
        "Draft acceptance of route {{ $labels.route }} dropped well below its usual level",
        "Acceptance of {{ $labels.route }} ({{ $labels.model_name }}) is {{ $value | humanizePercentage }} "
        f"below its 1-day level over the last {' or '.join(drop.windows)}, by more than {drop.z} "
        f"request-level standard errors over at least {drop.min_requests} requests, against a day of at "
        f"least {drop.min_baseline_requests}. Tokens per step and the "
        "speedup fall with it; below break-even speculation costs more than it saves."
        + _cause(mix)
        + _replicas(mix),
        _cause_labels(mix),
    )


def _cause_labels(mix: Mixin) -> dict[str, str]:
    """`cause`: mix (the traffic moved) or within (the bands' own acceptance: the engine,
    model or drafter), and `dimension`: the one a mix moved along, `all` for within (the
    engine's change is on every dimension): the part the dashboards' "Why acceptance moved"
    panel names (the recorded slices.cause). `unknown` for both while the route has no split
    (no baseline before its window yet): never empty, as Prometheus' ALERTS series would then
    show the label's template. A cause that changes while the drop lasts makes a new alert: a
    new cause is news."""
    rule = slices.cause_rule(mix.breakdown.window, mix.breakdown.baseline)
    found = _query(f"{rule}{{route=%q, model_name=%q}}", "$labels.route $labels.model_name")
    return {
        "cause": f"{{{{ with {found} }}}}{{{{ (index . 0).Labels.part }}}}{{{{ else }}}}unknown{{{{ end }}}}",
        "dimension": (
            f'{{{{ with {found} }}}}{{{{ if eq (index . 0).Labels.part "mix" }}}}'
            "{{ (index . 0).Labels.dimension }}{{ else }}all{{ end }}{{ else }}unknown{{ end }}"
        ),
    }


def _cause(mix: Mixin) -> str:
    """The drop's cause from the recorded split (dashboards/queries/slices.py), in words: the
    dimension whose traffic mix moved acceptance most; if its mix part outweighs its within
    part, the traffic changed (and which band grew), else the bands' own acceptance fell.
    Nothing where the route has no split (no exact requests: no slices)."""
    w, b = mix.breakdown.window, mix.breakdown.baseline
    change = slices.change_rule(w, b)
    share_w, share_b = slices.band_rule("share", w), slices.baseline_rule("share", w, b)
    route = "route=%q, model_name=%q"
    dim = f"{route}, dimension=%q"
    mine = "$labels.route $labels.model_name"
    this = f"{mine} $d"
    mixed, inside = f"{change}{{{dim}, part='mix'}}", f"{change}{{{dim}, part='within'}}"
    total = f"sum by (route, model_name) ({change}{{{dim}}})"
    grown = f"topk(1, ({share_w}{{{dim}}} - {share_b}{{{dim}}}) or {share_w}{{{dim}}})"
    mix_wins = f"abs({mixed}) >= bool ignoring (part) abs({inside})"
    return (
        f"{{{{ with {_query(f'topk(1, abs({change}{{{route}, part={_MIX}}}))', mine)} }}}}"
        "{{ $d := (index . 0).Labels.dimension }}"
        f" Over the last {w} against {b}:"
        f"{{{{ if eq ({_query(mix_wins, f'{this} {this}')} | first | value) 1.0 }}}}"
        f" {_pp(mixed, this)} pp of {_pp(total, this)} pp is traffic mix along {{{{ $d }}}}"
        f"{{{{ with {_query(grown, f'{this} {this} {this}')} }}}}"
        "{{ $b := (index . 0).Labels.band }}: `{{ $b }}` went from "
        f"{_percent(f'({share_b}{{{dim}, band=%q}} or vector(0))', this + ' $b')} % to "
        f"{_percent(f'{share_w}{{{dim}, band=%q}}', this + ' $b')} % of draft tokens{{{{ end }}}}"
        f"; within bands {_pp(inside, this)} pp: the traffic changed, find the client."
        f"{{{{ else }}}} {_pp(inside, this)} pp of {_pp(total, this)} pp is within bands along"
        " {{ $d }} (requests like the day's accept less: the engine, model or drafter"
        f" changed); traffic mix {_pp(mixed, this)} pp.{{{{ end }}}}{{{{ end }}}}"
    )


def _replicas(mix: Mixin) -> str:
    """The replicas the drop is on (each more than the fraction below the route's day over
    enough requests), by every label of theirs (region, pod, instance, ...), where they are
    some of the route's replicas; nothing where they are all of them (one replica, or a
    fleet-wide drop: the traffic or a release)."""
    drop = mix.acceptance_drop
    below = " or ".join(
        f"({replica_relative_drop(w)} > {drop.fraction}"
        f" and {replica_requests(w)} >= {drop.min_requests})"
        for w in drop.windows
    )
    mine = f"{rule_name('exact_acceptance', 'ratio_rate', '1d')}{{route=%q, model_name=%q}}"
    serving = f"{replica_requests(drop.windows[-1])} > 0"
    some = (
        f"({below}) and on (route, model_name) {mine}"
        f" unless on (route, model_name) count by (route, model_name) ({below})"
        f" >= count by (route, model_name) ({serving})"
    )
    some = some.replace(chr(10), " ").replace('"', "'")
    skip = '(eq $k "route") (eq $k "model_name") (eq $k "job")'
    return (
        f"{{{{ with {_query(some, '$labels.route $labels.model_name')} }}}}"
        " Only on {{ range $i, $r := . }}{{ if $i }}, {{ end }}"
        f"{{{{ range $k, $v := $r.Labels }}}}{{{{ if not (or {skip}) }}}}{{{{ $k }}}}={{{{ $v }}}} {{{{ end }}}}{{{{ end }}}}"
        "({{ $r.Value | humanizePercentage }} below){{ end }}: the other replicas hold.{{ end }}"
    )


_MIX = "'mix'"


def _query(expr: str, args: str) -> str:
    """A Go template `query` of a PromQL expression built by `printf` (its %q from `args`,
    template values; the PromQL quotes its own strings with single quotes)."""
    return f'query (printf "{expr}" {args})'


def _pp(expr: str, args: str) -> str:
    """The expression's first value x 100, signed, one decimal: percentage points (+ 0: a
    rounding's -0 reads +0.0)."""
    return f'{{{{ {_query(f"round(100 * {expr}, 0.01) + 0", args)} | first | value | printf "%+.1f" }}}}'


def _percent(expr: str, args: str) -> str:
    return f'{{{{ {_query(f"100 * {expr}", args)} | first | value | printf "%.0f" }}}}'


def runaway_generations(mix: Mixin) -> dict[str, Any]:
    runaway = mix.runaway
    w = runaway.window
    share = rule_name("runaway_requests", "share_rate", w)
    base = rule_name("runaway_requests", "share_rate", "1d")
    expr = (
        f"{share} > {runaway.share}\n"
        f"and on (route, model_name) {share} > on (route, model_name) {runaway.over_baseline:g} * {base}\n"
        f"and on (route, model_name) sum by (route, model_name) (increase(specdec_route_runaway_requests_total[{w}])) >= {runaway.min_loops}"
    )
    return _alert(
        mix,
        "SpecDecodeRunawayGenerations",
        expr,
        "0s",
        "warning",
        "Route {{ $labels.route }} has many runaway generations (repetition loops)",
        "{{ $value | humanizePercentage }} of {{ $labels.route }}'s requests ({{ $labels.model_name }}) over "
        f"the last {w} ran to max_tokens with acceptance near 1 (>= 0.95), well above the route's own day: "
        "the model is repeating itself, and the drafter predicts the loop perfectly.",
    )


def acceptance_collapsed(mix: Mixin) -> dict[str, Any]:
    collapsed, w = mix.collapsed, mix.runaway.window
    share = rule_name("collapsed_requests", "share_rate", w)
    expr = (
        f"{share} >= {collapsed.share}\n"
        f"and on (route, model_name) {rule_name('collapsed_requests', 'share_rate', '1d')} < {collapsed.baseline}\n"
        f"and on (route, model_name) {rule_name('exact_acceptance', 'ratio_rate', '1d')} >= {collapsed.normal_acceptance}\n"
        f"and on (route, model_name) {rule_name('spec_requests', 'increase', w)} >= {mix.acceptance_drop.min_requests}"
    )
    return _alert(
        mix,
        "SpecDecodeAcceptanceCollapsed",
        expr,
        "0s",
        "warning",
        "Draft acceptance of route {{ $labels.route }} collapsed to near zero",
        "{{ $value | humanizePercentage }} of {{ $labels.route }}'s requests ({{ $labels.model_name }}) over "
        f"the last {w} accepted almost no drafts (<= 5 %), on a route whose day is normally well above: "
        "garbled output, or a draft model that no longer matches the target.",
    )


def silently_off(mix: Mixin) -> dict[str, Any]:
    """Traffic without drafts, seen three ways: a route's tokens (the proxy), vLLM's tokens,
    and TensorRT-LLM's finished requests on a model that drafted before (its
    acceptance_rate_threshold gate turns speculation off for good; it counts no tokens, and
    its draft counters are per position in some releases, in total in others: either). Not
    where a dynamic schedule said k = 0 at some point of the window: no drafts is then by
    design (`advise`'s own schedules end in 0 at large batches)."""
    vllm = f"{{{mix.vllm_selector}}}" if mix.vllm_selector else ""
    trt = f"{{{mix.trtllm_selector}}}" if mix.trtllm_selector else ""
    names = '__name__=~"trtllm_spec_decode_(num_draft_tokens|drafted_tokens)_total"'
    drafted = f"{{{names}{', ' + mix.trtllm_selector if mix.trtllm_selector else ''}}}"
    by_design = (
        " unless on (model_name)"
        " min by (model_name) (min_over_time(specdec_engine_scheduled_draft_length[10m])) == 0"
    )
    return _alert(
        mix,
        "SpecDecodeSilentlyOff",
        "(sum by (route, model_name) (rate(specdec_route_generation_tokens_total[10m])) > 0\n"
        " unless on (route, model_name) sum by (route, model_name) (rate(specdec_route_drafts_total[10m])) > 0\n"
        f"{by_design})\n"
        "or\n"
        f"(sum by (model_name) (rate(vllm:generation_tokens_total{vllm}[10m])) > 0\n"
        f" unless on (model_name) sum by (model_name) (rate(vllm:spec_decode_num_drafts_total{vllm}[10m])) > 0\n"
        f"{by_design})\n"
        "or\n"
        f"(sum by (model_name) (rate(trtllm_request_success_total{trt}[10m])) > 0\n"
        f" and on (model_name) sum by (model_name) ({drafted}) > 0\n"
        f" unless on (model_name) sum by (model_name) (rate({drafted}[10m])) > 0)",
        mix.for_.silently_off,
        "warning",
        "Requests are served but no drafts are made ({{ $labels.model_name }})",
        "{{ $labels.model_name }} serves {{ $value | humanize }}/s (tokens; finished requests on "
        "TensorRT-LLM) and proposes no draft tokens: speculative decoding is off (TensorRT-LLM turns "
        "it off by itself when acceptance falls below acceptance_rate_threshold), or its drafter "
        "finds nothing to propose.",
    )


def schedule_not_in_effect(mix: Mixin) -> dict[str, Any]:
    """Drafts made where the schedule in the config says none, its whole window: the engine
    does not run the schedule it was given (vLLM #48494/#54748: an operator had to read the
    process's command line to learn it; ignored under data parallelism > 1)."""
    return _alert(
        mix,
        "SpecDecodeScheduleNotInEffect",
        "sum by (model_name) (rate(specdec_drafts_total[10m])) > 0\n"
        "and on (model_name)\n"
        "max by (model_name) (max_over_time(specdec_engine_scheduled_draft_length[10m])) == 0",
        mix.for_.schedule_not_in_effect,
        "warning",
        "{{ $labels.model_name }} drafts where its schedule says it should not",
        "{{ $labels.model_name }} makes {{ $value | humanize }} verify steps/s while its batch "
        "is in a range where the configured draft_length_schedule gives k = 0: the engine does "
        "not run that schedule (not passed in --speculative-config, or data parallelism > 1, "
        "where vLLM ignores it), or the config's schedule is not the engine's.",
    )


def costly_at_load(mix: Mixin) -> dict[str, Any]:
    """The load-aware speedup's upper 95 % bound below 1: the speedup scales with tokens per
    step T, whose accepted part (T - 1) carries the acceptance's relative error, so the bound
    is S x (1 + (1 - 1/T) x half-width / acceptance)."""
    w = "5m"
    upper = (
        f"{ROUTES.rule_name('estimated_speedup', f'ratio_rate{w}')}\n"
        f"* on (route, model_name) (\n"
        f"  {ROUTES.rule_name('acceptance_ci_halfwidth', f'rate{w}')}\n"
        f"  / on (route, model_name) {ROUTES.rule_name('exact_acceptance', f'ratio_rate{w}')}\n"
        f"  * on (route, model_name) (1 - 1 / {ROUTES.rule_name('tokens_per_step', f'ratio_rate{w}')})\n"
        f"  + 1\n)"
    )
    return _alert(
        mix,
        "SpecDecodeCostlyAtLoad",
        f"{upper}\n< 1",
        mix.for_.costly_at_load,
        "warning",
        "Speculation slows route {{ $labels.route }} down at the load it runs",
        "At the engine's current batch, {{ $labels.route }} ({{ $labels.model_name }}) would decode "
        'faster without speculation: even the upper end of its 95 % interval is {{ $value | printf "%.2f" }}x. '
        "A verify step's extra tokens cost compute at this batch; see the best draft length "
        "(specdec_route_best_draft_length) or `specdec advise`.",
    )


def alert_groups(mix: Mixin) -> list[dict[str, Any]]:
    rules = [  # SpecDecodeAcceptanceDrop lives with its recording rules (dashboards/rules.py)
        runaway_generations(mix),
        acceptance_collapsed(mix),
        below_breakeven(mix),
        costly_at_load(mix),
        silently_off(mix),
        schedule_not_in_effect(mix),
        exact_counts_lost(mix),
        counters_missing(mix),
        target_down(mix),
        exporter_down(mix),
        coverage_low(mix),
        curve_stale(mix),
    ]
    return [{"name": "specdec-alerts", "rules": rules}]


def below_breakeven(mix: Mixin) -> dict[str, Any]:
    """An hour in which the route's tokens per step did not pay for its verify steps."""
    return _alert(
        mix,
        "SpecDecodeBelowBreakEven",
        f"{ROUTES.rule_name('estimated_speedup', 'ratio_rate1h')} < 1\n"
        f"and on (route, model_name) ({ROUTES.rule_name('requests', 'rate5m')} * 300) >= {mix.min_requests_5m}",
        mix.for_.below_breakeven,
        "warning",
        "Speculation costs more than it saves on route {{ $labels.route }}",
        "Estimated speedup of {{ $labels.route }} ({{ $labels.model_name }}) over the last hour is "
        '{{ $value | printf "%.2f" }}x: tokens per step no longer cover the cost of a verify step.',
    )


def exact_counts_lost(mix: Mixin) -> dict[str, Any]:
    """A route that had vLLM's per-request objects today and lost them while the engine drafts."""
    vllm = f"{{{mix.vllm_selector}}}" if mix.vllm_selector else ""
    return _alert(
        mix,
        "SpecDecodeExactCountsLost",
        "(sum by (route, model_name) (rate(specdec_route_requests_without_spec_metrics_total"
        '{reason=~"not_sent|unknown_shape|implausible"}[10m])) > 0\n'
        " unless on (route, model_name) sum by (route, model_name) (rate(specdec_route_spec_requests_total[10m])) > 0)\n"
        "and on (route, model_name) sum by (route, model_name) (increase(specdec_route_spec_requests_total[1d])) > 0\n"
        f"and on (model_name) sum by (model_name) (rate(vllm:spec_decode_num_drafts_total{vllm}[10m])) > 0",
        mix.for_.exact_counts_lost,
        "warning",
        "Route {{ $labels.route }} lost its exact per-request counts",
        "{{ $value | humanize }} requests/s of {{ $labels.route }} ({{ $labels.model_name }}) end without "
        "vLLM's per-request speculative-decoding object while the engine drafts; earlier today they had "
        "it. The route's figures are estimates now: something upstream strips the object, or vLLM "
        "restarted without --per-request-spec-decode-metrics.",
    )


def counters_missing(mix: Mixin) -> dict[str, Any]:
    """A target the sidecar reads without speculative-decoding counters: speculation off, or a wrong engine/prefix."""
    return _alert(
        mix,
        "SpecDecodeCountersMissing",
        'rate(specdec_scrape_errors_total{reason="no_spec_metrics"}[5m]) > 0',
        mix.for_.counters_missing,
        "warning",
        "vLLM target {{ $labels.target }} exposes no speculative-decoding counters",
        "The sidecar reads {{ $labels.target }} but finds no spec_decode counters: vLLM runs "
        "without --speculative-config, or the target's engine/prefix setting is wrong.",
    )


def target_down(mix: Mixin) -> dict[str, Any]:
    """A vLLM target the sidecar cannot scrape: every figure of it is gone."""
    return _alert(
        mix,
        "SpecDecodeTargetDown",
        "specdec_target_up == 0",
        mix.for_.target_down,
        "critical",
        "The sidecar cannot scrape vLLM target {{ $labels.target }}",
        "specdec_target_up is 0 for {{ $labels.target }} ({{ $labels.instance }}): see "
        "specdec_scrape_errors_total by reason. Derived gauges of the target are gone.",
    )


def exporter_down(mix: Mixin) -> dict[str, Any]:
    """Prometheus cannot scrape the sidecar: every figure and alert here is blind."""
    return _alert(
        mix,
        "SpecDecodeExporterDown",
        f"up{{{mix.sidecar_selector}}} == 0 or absent(up{{{mix.sidecar_selector}}})",
        mix.for_.exporter_down,
        "critical",
        "Prometheus cannot scrape the specdec sidecar",
        # absent() has no instance label: name the job then, not an empty string
        "No specdec metrics from {{ with $labels.instance }}{{ . }}{{ else }}any target of "
        f"{mix.sidecar_selector}{{{{ end }}}}: acceptance, routes and these alerts are blind.",
    )


def coverage_low(mix: Mixin) -> dict[str, Any]:
    """Drafts the proxy did not see: clients that bypass it make the per-route figures partial."""
    return _alert(
        mix,
        "SpecDecodeAttributionCoverageLow",
        f'specdec_attribution_coverage_ratio{{window="15m"}} < {mix.coverage_min}',
        mix.for_.attribution_coverage,
        "info",
        "Traffic bypasses the route-tagging proxy on {{ $labels.target }}",
        "Only {{ $value | humanizePercentage }} of the engine's drafts over 15m were accounted to "
        "routes: some clients talk to vLLM directly, so per-route figures miss that traffic.",
    )


def curve_stale(mix: Mixin) -> dict[str, Any]:
    """The engine's step has left the curve measure gave it by more than measure's own error:
    on the GPU bench one start of the same servers ran the speculative step 8-9 % off the
    next, and a speedup right in one start read 19 % high in the other."""
    drift = "specdec_model_curve_drift_ratio"
    return _alert(
        mix,
        "SpecDecodeCurveStale",
        f"{drift}\nand\nabs({drift} - 1) > specdec_model_curve_drift_tolerance_ratio",
        mix.for_.curve_stale,
        "warning",
        "The step-time curve of {{ $labels.model_name }} is stale: re-measure it",
        "{{ $labels.model_name }}'s engine runs its decode steps at "
        '{{ $value | printf "x%.3f" }} of the step its step_time curve gives at the same batch, '
        "context and drafts per step, beyond measure's own error "
        "(specdec_model_curve_drift_tolerance_ratio): the engine no longer runs as when it was "
        "measured (another start, card, clock or build). The speedups' half-widths carry the "
        "drift; the figures themselves are read through the old curve. Re-measure on this "
        "engine and replace the model's step_time block: specdec measure --base-url "
        "http://VLLM:8000 --baseline-url http://VLLM_WITHOUT_SPECULATION:8000 --scenario-file "
        "YOUR_ROUTES.jsonl --concurrency 1,8,32",
    )
