"""Request slices: which band of each dimension a request falls in, and a route's acceptance
change split into traffic mix and within-band parts.

Acceptance moves with what requests ask for (sampling temperature, structured output, prompt
length) as much as with the drafter, so each exact request's draft and accepted tokens also go
to one band of each dimension (additive: a band per dimension, never a cross product). A
route's change of acceptance from a baseline window B to a window W is then, for any
dimension, exactly

    sum_b (share_W,b - share_B,b) * acc_B,b      mix: the traffic moved between bands
  + sum_b  share_W,b * (acc_W,b - acc_B,b)       within: the bands themselves moved

with shares by draft tokens. A band without drafts in B counts wholly as mix (its acc_B taken
as its acc_W), one without drafts in W contributes its lost share; a band that drafts nothing
weighs nothing (speculation off for that traffic, not zero acceptance). Every band name here
is fixed: no label value comes from a client.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter.core.fieldwise import Fieldwise

TEMPERATURE, OUTPUT, PROMPT_TOKENS = "temperature", "output", "prompt_tokens"
BANDS: dict[str, tuple[str, ...]] = {
    TEMPERATURE: ("greedy", "low", "mid", "high", "unset"),
    OUTPUT: ("text", "structured", "tools"),
    PROMPT_TOKENS: ("le512", "le2k", "le8k", "le32k", "gt32k", "unknown"),
}
PROMPT_LIMITS = ((512, "le512"), (2048, "le2k"), (8192, "le8k"), (32768, "le32k"))
# request members that make vLLM constrain its output (its guided decoding, old and new names)
GUIDED = (
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_decoding_backend",
)
STRUCTURED_FORMATS = ("json_schema", "json_object")
PARTS = ("mix", "within")

Slices = tuple[tuple[str, str], ...]  # (dimension, band), one per dimension


def temperature_band(body: Mapping[str, Any]) -> str:
    """`greedy` (0), `low` (0, 0.5], `mid` (0.5, 1.0], `high` (> 1.0); `unset` where absent or
    not a finite number >= 0 (the engine's default applies, or it refuses the request)."""
    t = body.get("temperature")
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t < 0:
        return "unset"
    if t == 0:
        return "greedy"
    return "low" if t <= 0.5 else "mid" if t <= 1.0 else "high"


def output_band(body: Mapping[str, Any]) -> str:
    """`tools` (a non-empty `tools` list, whatever else is set), `structured` (`response_format`
    of type json_schema / json_object, or vLLM's guided decoding members), else `text`."""
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        return "tools"
    form = body.get("response_format")
    if isinstance(form, Mapping) and form.get("type") in STRUCTURED_FORMATS:
        return "structured"
    if any(body.get(name) not in (None, False) for name in GUIDED):
        return "structured"
    return "text"


def prompt_band(prompt_tokens: int | None) -> str:
    """The prompt's length band, from the engine's own count (`unknown`: it stated none)."""
    if prompt_tokens is None:
        return "unknown"
    return next((band for limit, band in PROMPT_LIMITS if prompt_tokens <= limit), "gt32k")


def request_bands(body: Mapping[str, Any]) -> tuple[str, str]:
    """The request's temperature and output bands, read from its body (any shape)."""
    return temperature_band(body), output_band(body)


def slices(bands: tuple[str, str], prompt_tokens: int | None) -> Slices:
    """A request's band of every dimension."""
    return (
        (TEMPERATURE, bands[0]),
        (OUTPUT, bands[1]),
        (PROMPT_TOKENS, prompt_band(prompt_tokens)),
    )


@dataclass(frozen=True, slots=True)
class SliceCounts(Fieldwise):
    """One band's exact requests: their draft and accepted tokens, how many, their
    completion tokens (draft tokens per completion token: how much of it speculation drafted)."""

    draft_tokens: float = 0.0
    accepted: float = 0.0
    requests: float = 0.0
    completion_tokens: float = 0.0


def change_parts(
    now: Mapping[str, SliceCounts], base: Mapping[str, SliceCounts]
) -> dict[str, float] | None:
    """One dimension's bands over W (`now`) and B (`base`): the change of acceptance split into
    `mix` and `within` (their sum is acc_W - acc_B exactly). None where either window drafted
    nothing (no acceptance to change)."""
    total_now = sum(c.draft_tokens for c in now.values())
    total_base = sum(c.draft_tokens for c in base.values())
    if total_now <= 0 or total_base <= 0:
        return None
    mix = within = 0.0
    for band in {*now, *base}:
        w, b = now.get(band, SliceCounts()), base.get(band, SliceCounts())
        share_w, share_b = w.draft_tokens / total_now, b.draft_tokens / total_base
        acc_w = w.accepted / w.draft_tokens if w.draft_tokens > 0 else None
        acc_b = b.accepted / b.draft_tokens if b.draft_tokens > 0 else acc_w
        if acc_b is None:  # drafted in neither: no weight
            continue
        mix += (share_w - share_b) * acc_b
        if acc_w is not None:
            within += share_w * (acc_w - acc_b)
    return {"mix": mix, "within": within}
