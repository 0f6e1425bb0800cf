"""Which metric families carry speculative-decoding counters, per serving engine.

vLLM V1 (and its re-labelled copies under KServe or Ray), the llama.cpp server and
TensorRT-LLM count the same things under different names. A `EngineFamilies` maps them to
the four roles the sidecar derives from: drafts (verify steps), draft tokens, accepted tokens
and accepted tokens per draft position.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from exporter.config import ENGINE_KINDS
from exporter.core.counts import Counts
from exporter.scrape.exposition import scan

DEFAULT_PREFIX = {"vllm": "vllm:", "llamacpp": "llamacpp:", "trtllm": "trtllm_"}


class Role(StrEnum):
    DRAFTS = "drafts"
    DRAFT_TOKENS = "draft_tokens"
    ACCEPTED = "accepted"
    PER_POSITION = "per_position"


@dataclass(frozen=True, slots=True)
class EngineFamilies:
    """Family base names (without `_total` / `_created`) for one engine kind and prefix."""

    kind: str
    lead: str
    roles: dict[str, Role]

    @property
    def has_drafts(self) -> bool:
        """TensorRT-LLM counts no verify steps, so it has no tokens per step or positions."""
        return Role.DRAFTS in self.roles.values()

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
    lead = (DEFAULT_PREFIX[kind] if prefix is None else prefix) + "spec_decode_num_"
    names = {
        "drafts": Role.DRAFTS,
        "draft_tokens": Role.DRAFT_TOKENS,
        "accepted_tokens": Role.ACCEPTED,
        "accepted_tokens_per_pos": Role.PER_POSITION,
    }
    if kind == "trtllm":
        names = {k: v for k, v in names.items() if k in ("draft_tokens", "accepted_tokens")}
    return EngineFamilies(kind, lead, {lead + suffix: role for suffix, role in names.items()})


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


def read_page(text: str, fams: EngineFamilies) -> Page:
    """Group the page's samples of `fams` by (model_name, engine); bad samples are counted."""
    found = scan(text, (fams.lead,))
    bad = found.bad_lines
    values: dict[SeriesKey, dict[str, float]] = {}
    positions: dict[SeriesKey, dict[int, float]] = {}
    created: dict[SeriesKey, list[tuple[str, float]]] = {}
    broken: set[SeriesKey] = set()  # a bad sample leaves its series incomplete
    for sample in found.samples:
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
            values[key], positions[key], created[key] = {}, {}, []
        position = _position(labels.get("position")) if role is Role.PER_POSITION else None
        if role is Role.PER_POSITION and position is None:
            bad += 1
            broken.add(key)
        elif is_created:
            created[key].append((f"{role}{'' if position is None else position}", sample.value))
        elif not (sample.value >= 0 and sample.value != float("inf")):
            bad += 1  # a counter is finite and non-negative; NaN fails the >= test too
            broken.add(key)
        elif position is not None:
            positions[key][position] = sample.value
        else:
            values[key][role] = sample.value
    series = {}
    required = [
        r for r in (Role.DRAFTS, Role.DRAFT_TOKENS, Role.ACCEPTED) if r in fams.roles.values()
    ]
    for key, vals in values.items():
        per_pos = positions[key]
        if key in broken:  # counted above; the rest would pass a bad last position off as k-1
            continue
        if any(r not in vals for r in required) or (per_pos and max(per_pos) + 1 != len(per_pos)):
            bad += 1  # an incomplete series (truncated page) would look like a restart: skip it
            continue
        counts = Counts(
            vals[Role.DRAFTS] if fams.has_drafts else None,
            vals[Role.DRAFT_TOKENS],
            vals[Role.ACCEPTED],
            tuple(per_pos[i] for i in range(len(per_pos))),
        )
        series[key] = RawSeries(counts, tuple(sorted(created[key])))
    return Page(series, bad)


def _position(text: str | None) -> int | None:
    # isdigit() alone admits "²" (int() rejects it) and int() rejects > 4300 digits: both raised
    if text is None or not (text.isascii() and text.isdigit()) or len(text) > 9:
        return None
    return int(text) if int(text) < MAX_POSITIONS else None
