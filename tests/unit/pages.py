"""Helpers that build /metrics pages: from the fixture pages with known changes, and a sidecar's
page as `specdec advise` reads it.

The fixtures are realistic vLLM 0.33 pages. Tests rewrite only the spec-decode sample lines
(`<prefix>spec_decode_num_<family>_total|_created{labels} value`) and leave the ~600 other
lines alone, so the scanner still has to find its lines in a real page.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path

from exporter.cli.advise import Page

FIXTURES = Path(__file__).parent.parent / "fixtures"
ONE_ENGINE = FIXTURES / "vllm-0.33-1engine-k3.prom"
FOUR_ENGINES = FIXTURES / "vllm-0.33-4engine-k5.prom"
BAD_CONFIGS = FIXTURES / "bad_configs"

MODEL = "Qwen/Qwen3-32B"
LEAD = "vllm:spec_decode_num_"

# The numbers on both fixture pages, per engine (read off the files by hand).
BASE_DRAFTS = 1.2e6
BASE_DRAFT_TOKENS = 3.6e6
BASE_ACCEPTED = 2.04e6
BASE_PER_POS_K3 = (900000.0, 680000.0, 460000.0)
BASE_PER_POS_K5 = (900000.0, 680000.0, 460000.0, 100000.0, 100000.0)

_LINE = re.compile(
    r"^(?P<name>vllm:spec_decode_num_(?P<family>[a-z_]+?)_(?P<kind>total|created))"
    r"\{(?P<labels>[^}]*)\} (?P<value>\S+)$",
    re.MULTILINE,
)
_LABEL = re.compile(r'([a-z_]+)="([^"]*)"')

Rewrite = Callable[[str, dict[str, str], float], float]


def one_engine() -> str:
    return ONE_ENGINE.read_text(encoding="utf-8")


def four_engines() -> str:
    return FOUR_ENGINES.read_text(encoding="utf-8")


def rewrite(text: str, fn: Rewrite, kind: str = "total") -> str:
    """Replace the value of every spec-decode `_total` (or `_created`) sample with
    fn(family, labels, old_value); family is e.g. "drafts" or "accepted_tokens_per_pos"."""

    def sub(match: re.Match[str]) -> str:
        if match.group("kind") != kind:
            return match.group()
        labels = dict(_LABEL.findall(match.group("labels")))
        value = fn(match.group("family"), labels, float(match.group("value")))
        return f"{match.group('name')}{{{match.group('labels')}}} {value!r}"

    result, n = _LINE.subn(sub, text)
    assert n > 0, "no spec-decode lines to rewrite"
    return result


def bump(
    text: str,
    drafts: float = 0.0,
    draft_tokens: float = 0.0,
    accepted: float = 0.0,
    per_pos: Iterable[float] = (),
    engines: Iterable[str] | None = None,
) -> str:
    """Add the given increments to the counters of `engines` (all engines when None)."""
    return _counters(text, (drafts, draft_tokens, accepted), per_pos, engines, lambda v, x: v + x)


def set_counts(
    text: str,
    drafts: float,
    draft_tokens: float,
    accepted: float,
    per_pos: Iterable[float],
    engines: Iterable[str] | None = None,
) -> str:
    """Set the counters of `engines` (all when None) to absolute values (e.g. after a reset)."""
    return _counters(text, (drafts, draft_tokens, accepted), per_pos, engines, lambda _v, x: x)


def _counters(
    text: str,
    totals: tuple[float, float, float],
    per_pos: Iterable[float],
    engines: Iterable[str] | None,
    combine: Callable[[float, float], float],
) -> str:
    """Combine each spec-decode counter of `engines` with its given figure (positions past the
    given ones get 0)."""
    per_pos = tuple(per_pos)
    only = None if engines is None else set(engines)
    by_family = dict(zip(("drafts", "draft_tokens", "accepted_tokens"), totals, strict=True))

    def fn(family: str, labels: dict[str, str], value: float) -> float:
        if only is not None and labels.get("engine") not in only:
            return value
        if family == "accepted_tokens_per_pos":
            i = int(labels["position"])
            return combine(value, per_pos[i] if i < len(per_pos) else 0.0)
        return combine(value, by_family[family])

    return rewrite(text, fn)


def shift_created(text: str, seconds: float) -> str:
    """Move every `_created` stamp (what a restarted engine shows)."""
    return rewrite(text, lambda _f, _l, v: v + seconds, kind="created")


def drop_lines(text: str, predicate: Callable[[str], bool]) -> str:
    """Remove the lines for which predicate(line) is true."""
    return "".join(line for line in text.splitlines(keepends=True) if not predicate(line))


# SGLang (0.5.18+): generation tokens by is_streaming, verify calls, the scheduler's gauges
SGLANG_PAGE = """\
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{{is_streaming="true",model_name="qwen"}} {streamed}
sglang:generation_tokens_total{{is_streaming="false",model_name="qwen"}} {whole}
# HELP sglang:spec_verify_calls_total The number of speculative decoding verification calls.
# TYPE sglang:spec_verify_calls_total counter
sglang:spec_verify_calls_total{{model_name="qwen"}} {verify}
# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{{{ranks}}} 2.5
# HELP sglang:spec_accept_rate The average acceptance rate of speculative decoding.
# TYPE sglang:spec_accept_rate gauge
sglang:spec_accept_rate{{{ranks}}} 0.5
""".replace(
    "{ranks}", 'engine_type="unified",model_name="qwen",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
)


def sidecar_page(
    with_curve: bool = True, with_routes: bool = True, measured_to: float = 256
) -> Page:
    """A sidecar's page as `specdec advise` reads it: the simulator's step curve for model
    "m", its position acceptance, one route's speedups by draft length."""
    p = Page()

    def add(name: str, value: float, **labels: str) -> None:
        p.samples[name].append((labels, value))

    if with_curve:  # the simulator's model: plain (0.98 + 0.02 b) / 72, verify (1.67 + 0.11 b) / 72
        add("specdec_model_plain_step_base_seconds", 0.98 / 72, model_name="m")
        add("specdec_model_plain_step_seconds_per_running_request", 0.02 / 72, model_name="m")
        add("specdec_model_verify_step_base_seconds", 1.67 / 72, model_name="m")
        add("specdec_model_verify_step_seconds_per_running_request", 0.11 / 72, model_name="m")
        add("specdec_model_step_curve_max_running_requests", measured_to, model_name="m")
    for i, v in enumerate((0.75, 0.52, 0.32)):  # P(more than i drafts accepted), the mix
        add("specdec_position_acceptance_ratio", v, model_name="m", engine="all", window="5m",
            position=str(i), target="t")  # fmt: skip
    if with_routes:
        key = {"route": "voice", "model_name": "m", "window": "5m"}
        add("specdec_route_estimated_speedup_ratio", 0.8, **key)
        add("specdec_route_speedup_ratio", 0.81, **key)
        for k, v in enumerate((1.0, 1.07, 0.97, 0.84)):
            add("specdec_route_speedup_at_draft_length_ratio", v, draft_length=str(k), **key)
        add("specdec_route_best_draft_length", 1.0, **key)
    return p
