"""Request slices: every request in one band of each dimension whatever its body says, the
bands adding up to the route's exact counts, and the acceptance change split into mix and
within that add up to the change."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.accounting.ledger import Accounting, RequestOutcome
from exporter.core.counts import Counts
from exporter.core.slices import (
    BANDS,
    OUTPUT,
    PROMPT_TOKENS,
    TEMPERATURE,
    SliceCounts,
    change_parts,
    output_band,
    prompt_band,
    request_bands,
    slices,
    temperature_band,
)
from exporter.core.windows import DEFAULT_WINDOWS


@pytest.mark.parametrize(
    ("temperature", "band"),
    [
        (0, "greedy"),
        (0.0, "greedy"),
        (0.2, "low"),
        (0.5, "low"),
        (0.7, "mid"),
        (1.0, "mid"),
        (1.5, "high"),
        (1e300, "high"),
        (None, "unset"),
        ("0.7", "unset"),
        (True, "unset"),
        (-1, "unset"),
        (math.nan, "unset"),
        (math.inf, "unset"),
        ([0.7], "unset"),
        ({"value": 0.7}, "unset"),
    ],
)
def test_temperature_bands_never_take_a_client_value(temperature: object, band: str) -> None:
    body = {} if temperature is None else {"temperature": temperature}
    assert temperature_band(body) == band


@pytest.mark.parametrize(
    ("body", "band"),
    [
        ({}, "text"),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "structured"),
        ({"response_format": {"type": "json_object"}}, "structured"),
        ({"response_format": {"type": "text"}}, "text"),
        ({"response_format": "json_object"}, "text"),
        ({"response_format": ["json_object"]}, "text"),
        ({"response_format": None}, "text"),
        ({"guided_json": {"type": "object"}}, "structured"),
        ({"structured_outputs": {"regex": "a+"}}, "structured"),
        ({"guided_choice": None}, "text"),
        ({"tools": [{"type": "function"}], "response_format": {"type": "json_object"}}, "tools"),
        ({"tools": []}, "text"),
        ({"tools": "all"}, "text"),
    ],
)
def test_output_bands(body: dict[str, object], band: str) -> None:
    assert output_band(body) == band


def test_prompt_bands() -> None:
    assert [prompt_band(n) for n in (0, 512, 513, 2048, 8192, 32768, 32769, None)] == [
        "le512", "le512", "le2k", "le2k", "le8k", "le32k", "gt32k", "unknown"
    ]  # fmt: skip


JSON = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)


@given(
    st.dictionaries(
        st.sampled_from(
            ["temperature", "tools", "response_format", "guided_json", "structured_outputs", "x"]
        )
        | st.text(max_size=8),
        JSON,
    )
)
def test_any_body_lands_in_a_known_band(body: dict[str, object]) -> None:
    temperature, output = request_bands(body)
    assert temperature in BANDS[TEMPERATURE] and output in BANDS[OUTPUT]


def _bands(**acc: tuple[float, float]) -> dict[str, SliceCounts]:
    """band -> (draft tokens, acceptance)."""
    return {b: SliceCounts(d, d * a, 1.0, d) for b, (d, a) in acc.items()}


def _acceptance(bands: dict[str, SliceCounts]) -> float:
    return sum(c.accepted for c in bands.values()) / sum(c.draft_tokens for c in bands.values())


def test_a_mix_shift_is_mix_and_a_degraded_engine_is_within() -> None:
    base = _bands(greedy=(800, 0.70), mid=(200, 0.30))
    shifted = _bands(greedy=(300, 0.70), mid=(700, 0.30))  # clients moved to sampling
    parts = change_parts(shifted, base)
    assert parts is not None
    assert parts["mix"] == pytest.approx(_acceptance(shifted) - _acceptance(base))
    assert parts["within"] == pytest.approx(0.0)
    degraded = _bands(greedy=(800, 0.55), mid=(200, 0.20))  # the drafter got worse
    parts = change_parts(degraded, base)
    assert parts is not None
    assert parts["within"] == pytest.approx(_acceptance(degraded) - _acceptance(base))
    assert parts["mix"] == pytest.approx(0.0)


@given(
    st.dictionaries(
        st.sampled_from(BANDS[TEMPERATURE]),
        st.tuples(st.floats(0, 1e6), st.floats(0, 1)),
        min_size=1,
    ),
    st.dictionaries(
        st.sampled_from(BANDS[TEMPERATURE]),
        st.tuples(st.floats(0, 1e6), st.floats(0, 1)),
        min_size=1,
    ),
)
def test_mix_and_within_add_up_to_the_change(
    now: dict[str, tuple[float, float]], base: dict[str, tuple[float, float]]
) -> None:
    """Whatever the bands, new ones and lost ones included."""
    w, b = _bands(**now), _bands(**base)
    parts = change_parts(w, b)
    if sum(c.draft_tokens for c in w.values()) <= 0 or sum(c.draft_tokens for c in b.values()) <= 0:
        assert parts is None
        return
    assert parts is not None
    change = _acceptance(w) - _acceptance(b)
    assert parts["mix"] + parts["within"] == pytest.approx(change, abs=1e-9)


def test_a_band_new_in_the_window_is_mix_and_one_that_drafts_nothing_weighs_nothing() -> None:
    base = _bands(greedy=(1000, 0.7))
    now = {**_bands(greedy=(500, 0.7), mid=(500, 0.3)), "high": SliceCounts(0, 0, 4, 900)}
    parts = change_parts(now, base)
    assert parts == {"mix": pytest.approx(0.5 * 0.3 - 0.5 * 0.7), "within": pytest.approx(0.0)}


def test_per_dimension_the_bands_add_up_to_the_routes_exact_counts() -> None:
    acc = Accounting(("a",), DEFAULT_WINDOWS, {})
    requests = [
        (Counts(10, 30, 20), 0.0, "text", 300),
        (Counts(5, 15, 4), 0.9, "structured", 5000),
        (Counts(7, 21, 9), None, "tools", None),
    ]
    for exact, temperature, output, prompt in requests:
        body: dict[str, object] = {} if temperature is None else {"temperature": temperature}
        bands = (temperature_band(body), output)
        acc.record(
            RequestOutcome(
                "a", "m", "200", 40, prompt_tokens=prompt, exact=exact, slices=slices(bands, prompt)
            )
        )
    acc.record(
        RequestOutcome("a", "m", "200", 40, drafted=(12, 6), slices=slices(("low", "text"), 9))
    )
    acc.record(RequestOutcome("a", "m", "503", 0, exact=Counts(1, 3, 3)))  # not a completion
    route = acc.exact[("a", "m")]
    for dimension in (TEMPERATURE, OUTPUT, PROMPT_TOKENS):
        mine = [c for (_, _, d, _), c in acc.slices.items() if d == dimension]
        assert sum(c.draft_tokens for c in mine) == route.draft_tokens == 30 + 15 + 21 + 12
        assert sum(c.accepted for c in mine) == route.accepted == 20 + 4 + 9 + 6
        assert sum(c.requests for c in mine) == 4
        assert sum(c.completion_tokens for c in mine) == 160
    assert acc.slices[("a", "m", PROMPT_TOKENS, "unknown")].requests == 1
    assert acc.slices[("a", "m", TEMPERATURE, "mid")].draft_tokens == 15
