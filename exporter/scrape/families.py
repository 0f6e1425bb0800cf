"""Which metric families carry speculative-decoding counters, per serving engine.

vLLM V1 (and its re-labelled copies under KServe or Ray), the llama.cpp server and
TensorRT-LLM count the same things under different names. SGLang counts only verify calls
(`sglang:spec_verify_calls_total`, 0.5.13+) and generation tokens: its tokens per step come from
those two (its own definition: the prefill's token included), its acceptance only from gauges,
which are kept as gauges (`EngineFamilies.gauges`), as TensorRT-LLM's acceptance length is.
An `EngineFamilies` maps them to the four roles the sidecar derives from: drafts (verify
steps), draft tokens, accepted tokens and accepted tokens per draft position.

TensorRT-LLM counts no verify steps, but its per-position counters (`token_position`, 0-based;
a position's series appears once it was first drafted) hold them: every step drafts position
0, so its drafted tokens there are the steps. Pages without them give tokens only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from exporter.config import ENGINE_KINDS
from exporter.core.counts import Counts
from exporter.scrape.exposition import scan

DEFAULT_PREFIX = {
    "vllm": "vllm:",
    "sglang": "sglang:",
    "llamacpp": "llamacpp:",
    "trtllm": "trtllm_",
}


class Role(StrEnum):
    DRAFTS = "drafts"
    DRAFT_TOKENS = "draft_tokens"
    ACCEPTED = "accepted"
    PER_POSITION = "per_position"
    DRAFTED_PER_POSITION = "drafted_per_position"  # TensorRT-LLM: position 0 = the steps
    GENERATED = "generated"  # SGLang: generation tokens, with its verify calls the steps


RUNNING = "running_requests"  # the engine's batch: requests in model execution now
# its gauge after the prefix (SGLang's is num_running_reqs, below; TensorRT-LLM has none)
RUNNING_GAUGE = {"vllm": "num_requests_running", "llamacpp": "requests_processing"}


@dataclass(frozen=True, slots=True)
class EngineFamilies:
    """Family base names (without `_total` / `_created`) for one engine kind and prefix."""

    kind: str
    lead: str
    roles: dict[str, Role]
    position_label: str = "position"
    # the engine's own gauges, kept as they are (sample name -> our name): never counters
    gauges: tuple[tuple[str, str], ...] = ()

    def classify(self, name: str) -> tuple[Role, bool] | None:
        """(role, is_created_gauge) for a sample name, or None when it is not ours."""
        for suffix, created in (("_total", False), ("_created", True)):
            if name.endswith(suffix):
                role = self.roles.get(name[: -len(suffix)])
                return None if role is None else (role, created)
        return None


def families(kind: str, prefix: str | None = None) -> EngineFamilies:
    """The families of engine `kind` under `prefix` (the kind's own prefix when None)."""
    if kind not in ENGINE_KINDS:
        raise ValueError(f"unknown engine {kind!r}; expected one of {', '.join(ENGINE_KINDS)}")
    if kind == "sglang":
        lead = DEFAULT_PREFIX[kind] if prefix is None else prefix
        roles = {
            lead + "spec_verify_calls": Role.DRAFTS,
            lead + "generation_tokens": Role.GENERATED,
        }
        gauges: tuple[tuple[str, str], ...] = (
            (lead + "spec_accept_length", "acceptance_length"),
            (lead + "spec_accept_rate", "acceptance_rate"),
            (lead + "num_running_reqs", RUNNING),
        )
        return EngineFamilies(kind, lead, roles, gauges=gauges)
    own = DEFAULT_PREFIX[kind] if prefix is None else prefix
    base = own + "spec_decode_"
    if kind == "trtllm":
        names = {
            "num_draft_tokens": Role.DRAFT_TOKENS,
            "num_accepted_tokens": Role.ACCEPTED,
            "drafted_tokens": Role.DRAFTED_PER_POSITION,
            "accepted_tokens": Role.PER_POSITION,
        }
        gauges = ((base + "acceptance_length", "acceptance_length"),)
        roles = {base + n: r for n, r in names.items()}
        return EngineFamilies(kind, base, roles, "token_position", gauges)
    lead = base + "num_"
    running = ((own + RUNNING_GAUGE[kind], RUNNING),) if kind in RUNNING_GAUGE else ()
    names = {
        "drafts": Role.DRAFTS,
        "draft_tokens": Role.DRAFT_TOKENS,
        "accepted_tokens": Role.ACCEPTED,
        "accepted_tokens_per_pos": Role.PER_POSITION,
    }
    roles = {lead + suffix: role for suffix, role in names.items()}
    return EngineFamilies(kind, lead, roles, gauges=running)


SeriesKey = tuple[str, str]
"""(model_name, engine) — the labels vLLM puts on its spec-decode counters."""

MAX_POSITIONS = 32  # k beyond this is not a real deployment: treat as garbage, bound cardinality
MAX_SERIES = 64  # per target page, for the same reason


@dataclass(frozen=True, slots=True)
class RawSeries:
    """One series' counter values as the engine reports them, plus their `_created` stamps."""

    counts: Counts
    created: tuple[tuple[str, float], ...]


@dataclass(frozen=True, slots=True)
class Page:
    """The spec-decode series found on one /metrics page."""

    series: dict[SeriesKey, RawSeries]
    bad_lines: int
    gauges: dict[SeriesKey, dict[str, float]] = field(default_factory=dict)  # engine's own


def read_page(text: str, fams: EngineFamilies) -> Page:
    """Group the page's samples of `fams` by (model_name, engine); bad samples are counted."""
    found = scan(text, (fams.lead, *(g for g, _ in fams.gauges if not g.startswith(fams.lead))))
    bad = found.bad_lines
    values: dict[SeriesKey, dict[str, float]] = {}
    positions: dict[SeriesKey, dict[int, float]] = {}
    drafted: dict[SeriesKey, dict[int, float]] = {}  # TensorRT-LLM's drafted tokens per position
    created: dict[SeriesKey, list[tuple[str, float]]] = {}
    broken: set[SeriesKey] = set()  # a bad sample leaves its series incomplete
    gauges: dict[SeriesKey, dict[str, list[float]]] = {}  # every rank's value, averaged below
    own = dict(fams.gauges)
    for sample in found.samples:
        if sample.name in own and sample.value == sample.value:  # NaN: nothing reported
            labels = dict(sample.labels)
            key = (labels.get("model_name", ""), labels.get("engine", ""))
            gauges.setdefault(key, {}).setdefault(own[sample.name], []).append(sample.value)
            continue
        kind = fams.classify(sample.name)
        if kind is None:
            continue
        role, is_created = kind
        labels = dict(sample.labels)
        key = (labels.get("model_name", ""), labels.get("engine", ""))
        if key not in values:
            if len(values) >= MAX_SERIES:
                bad += 1
                continue
            values[key], positions[key], drafted[key], created[key] = {}, {}, {}, []
        per_position = role in (Role.PER_POSITION, Role.DRAFTED_PER_POSITION)
        position = _position(labels.get(fams.position_label)) if per_position else None
        if per_position and position is None:
            bad += 1
            broken.add(key)
        elif is_created:
            created[key].append((f"{role}{'' if position is None else position}", sample.value))
        elif not (sample.value >= 0 and sample.value != float("inf")):
            bad += 1  # a counter is finite and non-negative; NaN fails the >= test too
            broken.add(key)
        elif position is not None:
            (drafted if role is Role.DRAFTED_PER_POSITION else positions)[key][position] = (
                sample.value
            )
        elif fams.kind == "sglang":  # summed over its other labels (is_streaming, custom ones)
            values[key][role] = values[key].get(role, 0.0) + sample.value
        else:
            values[key][role] = sample.value
    series = {}
    for key, vals in values.items():
        if key in broken:  # counted above; the rest would pass a bad last position off as k-1
            continue
        if fams.kind == "sglang":
            if Role.DRAFTS not in vals:  # generation tokens alone: speculation is off
                continue
            counts: Counts | None = Counts(vals[Role.DRAFTS], generated=vals.get(Role.GENERATED))
        elif fams.kind == "trtllm":
            counts = _trtllm(vals, positions[key], drafted[key])
        else:
            counts = _counts(vals, positions[key])
        if counts is None or (fams.kind == "sglang" and counts.generated is None):
            bad += 1  # an incomplete series (truncated page) would look like a restart: skip it
            continue
        series[key] = RawSeries(counts, tuple(sorted(created[key])))
    # one figure per series: the mean over the scheduler ranks (SGLang: tp/pp/dp) that report it
    means = {
        key: {name: sum(vs) / len(vs) for name, vs in found.items()}
        for key, found in gauges.items()
        if key in series
    }
    return Page(series, bad, means)


def _counts(vals: dict[str, float], per_pos: dict[int, float]) -> Counts | None:
    """vLLM's and llama.cpp's four families, all present, positions 0..k-1 without a gap."""
    if any(r not in vals for r in (Role.DRAFTS, Role.DRAFT_TOKENS, Role.ACCEPTED)):
        return None
    if per_pos and max(per_pos) + 1 != len(per_pos):
        return None
    k = len(per_pos)
    return Counts(
        vals[Role.DRAFTS], vals[Role.DRAFT_TOKENS], vals[Role.ACCEPTED], _dense(per_pos, k)
    )


def _trtllm(
    vals: dict[str, float], accepted: dict[int, float], drafted: dict[int, float]
) -> Counts | None:
    """TensorRT-LLM: the token counters, or their per-position sums where only those exist;
    the steps are position 0's drafted tokens. Positions are those drafted so far; one never
    accepted has no series yet (0)."""
    if drafted and (max(drafted) + 1 != len(drafted) or max(accepted, default=0) >= len(drafted)):
        return None
    tokens = vals.get(Role.DRAFT_TOKENS, sum(drafted.values()) if drafted else None)
    taken = vals.get(Role.ACCEPTED, sum(accepted.values()) if drafted else None)
    if tokens is None or taken is None:
        return None
    if not drafted:  # nothing drafted yet has no position series either: 0 steps, not unknown
        return Counts(0.0 if tokens == 0 else None, tokens, taken, ())
    return Counts(drafted[0], tokens, taken, _dense(accepted, len(drafted)))


def _dense(per_pos: dict[int, float], k: int) -> tuple[float, ...]:
    return tuple(per_pos.get(i, 0.0) for i in range(k))


def _position(text: str | None) -> int | None:
    # isdigit() alone admits "²" (int() rejects it) and int() rejects > 4300 digits: both raised
    if text is None or not (text.isascii() and text.isdigit()) or len(text) > 9:
        return None
    return int(text) if int(text) < MAX_POSITIONS else None
