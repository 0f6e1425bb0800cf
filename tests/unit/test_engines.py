"""Engine families: which lines of a page become which series' Counts, per engine and prefix."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from exporter.core.counts import Counts, Ratios, ratios
from exporter.scrape.families import MAX_POSITIONS, MAX_SERIES, Role, families, read_page
from exporter.scrape.totals import RunningTotals

from .pages import (
    BASE_ACCEPTED,
    BASE_DRAFT_TOKENS,
    BASE_DRAFTS,
    BASE_PER_POS_K3,
    BASE_PER_POS_K5,
    LEAD,
    MODEL,
    SGLANG_PAGE,
    drop_lines,
    four_engines,
    one_engine,
    rewrite,
)

VLLM = families("vllm")


def reference_counts(text: str, lead: str) -> dict[tuple[str, str], Counts]:
    """The page's counters per (model_name, engine), read with prometheus_client's parser."""
    found: dict[tuple[str, str], dict[str, float]] = {}
    per_pos: dict[tuple[str, str], dict[int, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not (s.name.startswith(lead) and s.name.endswith("_total")):
                continue
            key = (s.labels["model_name"], s.labels["engine"])
            role = s.name[len(lead) : -len("_total")]
            if role == "accepted_tokens_per_pos":
                per_pos.setdefault(key, {})[int(s.labels["position"])] = s.value
            else:
                found.setdefault(key, {})[role] = s.value
    return {
        key: Counts(
            v["drafts"],
            v["draft_tokens"],
            v["accepted_tokens"],
            tuple(per_pos[key][i] for i in range(len(per_pos[key]))),
        )
        for key, v in found.items()
    }


def test_one_engine_fixture():
    page = read_page(one_engine(), VLLM)
    assert page.bad_lines == 0
    assert list(page.series) == [(MODEL, "0")]
    raw = page.series[(MODEL, "0")]
    assert raw.counts == Counts(BASE_DRAFTS, BASE_DRAFT_TOKENS, BASE_ACCEPTED, BASE_PER_POS_K3)
    assert raw.counts == reference_counts(one_engine(), LEAD)[(MODEL, "0")]
    created = dict(raw.created)
    assert set(created) == {
        "drafts",
        "draft_tokens",
        "accepted",
        "per_position0",
        "per_position1",
        "per_position2",
    }
    assert created["drafts"] == 1.7959617596088421e09
    assert created["per_position2"] == 1.7959617596088998e09


def test_four_engine_fixture():
    text = four_engines()
    page = read_page(text, VLLM)
    assert page.bad_lines == 0
    assert sorted(page.series) == [(MODEL, e) for e in "0123"]
    expected = Counts(BASE_DRAFTS, BASE_DRAFT_TOKENS, BASE_ACCEPTED, BASE_PER_POS_K5)
    assert all(raw.counts == expected for raw in page.series.values())
    assert {k: r.counts for k, r in page.series.items()} == reference_counts(text, LEAD)


def test_engines_are_told_apart_by_their_label():
    text = rewrite(four_engines(), lambda _f, labels, v: v + int(labels["engine"]))
    page = read_page(text, VLLM)
    assert [page.series[(MODEL, e)].counts.drafts for e in "0123"] == [
        1200000.0,
        1200001.0,
        1200002.0,
        1200003.0,
    ]


@pytest.mark.parametrize("prefix", ["kserve_vllm:", "ray_vllm_", "ray_vllm:"])
def test_relabelled_prefixes(prefix):
    text = one_engine().replace("vllm:", prefix)
    page = read_page(text, families("vllm", prefix))
    assert page.bad_lines == 0
    assert page.series[(MODEL, "0")].counts == Counts(
        BASE_DRAFTS, BASE_DRAFT_TOKENS, BASE_ACCEPTED, BASE_PER_POS_K3
    )
    # the default prefix does not see them, not even inside the longer names
    assert read_page(text, VLLM).series == {}


def test_default_prefix_ignores_relabelled_copies_on_the_same_page():
    text = one_engine() + one_engine().replace("vllm:", "kserve_vllm:").replace("1.2e+06", "7.0")
    assert read_page(text, VLLM).series[(MODEL, "0")].counts.drafts == BASE_DRAFTS
    assert read_page(text, families("vllm", "kserve_vllm:")).series[(MODEL, "0")].counts.drafts == 7


def test_llamacpp_uses_the_same_four_names():
    fams = families("llamacpp")
    assert fams.lead == "llamacpp:spec_decode_num_"
    assert Role.DRAFTS in fams.roles.values()
    text = one_engine().replace("vllm:spec_decode", "llamacpp:spec_decode")
    page = read_page(text, fams)
    assert page.series[(MODEL, "0")].counts == Counts(
        BASE_DRAFTS, BASE_DRAFT_TOKENS, BASE_ACCEPTED, BASE_PER_POS_K3
    )
    assert read_page(one_engine(), fams).series == {}


TRTLLM_PAGE = """\
# HELP trtllm_spec_decode_num_draft_tokens_total Draft tokens.
# TYPE trtllm_spec_decode_num_draft_tokens_total counter
trtllm_spec_decode_num_draft_tokens_total{model_name="llama",engine="0"} 3000.0
# HELP trtllm_spec_decode_num_accepted_tokens_total Accepted draft tokens.
# TYPE trtllm_spec_decode_num_accepted_tokens_total counter
trtllm_spec_decode_num_accepted_tokens_total{model_name="llama",engine="0"} 1800.0
# HELP trtllm_spec_decode_acceptance_length Mean acceptance length.
# TYPE trtllm_spec_decode_acceptance_length gauge
trtllm_spec_decode_acceptance_length{model_name="llama",engine="0"} 2.5
trtllm_spec_decode_num_drafts_total{model_name="llama",engine="0"} 999.0
trtllm_spec_decode_num_accepted_tokens_per_pos_total{model_name="llama",engine="0",position="0"} 9
"""


def test_trtllm_without_per_position_counters_has_tokens_only():
    fams = families("trtllm")
    assert fams.lead == "trtllm_spec_decode_" and fams.position_label == "token_position"
    page = read_page(TRTLLM_PAGE, fams)
    assert page.bad_lines == 0
    assert page.series == {
        ("llama", "0"): page.series[("llama", "0")],
    }
    assert page.series[("llama", "0")].counts == Counts(None, 3000.0, 1800.0, ())


# as TensorRT-LLM's MetricsCollector writes them (tensorrt_llm/metrics/collector.py): a
# position's series appears once drafted (accepted: once accepted), labels model_name and
# engine_type from the server
TRTLLM_POSITIONS = """\
# HELP trtllm_spec_decode_drafted_tokens_total Total drafted tokens per speculative decoding position.
# TYPE trtllm_spec_decode_drafted_tokens_total counter
trtllm_spec_decode_drafted_tokens_total{engine_type="trtllm",model_name="llama",token_position="0"} 1000.0
trtllm_spec_decode_drafted_tokens_total{engine_type="trtllm",model_name="llama",token_position="1"} 1000.0
trtllm_spec_decode_drafted_tokens_total{engine_type="trtllm",model_name="llama",token_position="2"} 1000.0
# HELP trtllm_spec_decode_accepted_tokens_total Total accepted tokens per speculative decoding position.
# TYPE trtllm_spec_decode_accepted_tokens_total counter
trtllm_spec_decode_accepted_tokens_total{engine_type="trtllm",model_name="llama",token_position="0"} 800.0
trtllm_spec_decode_accepted_tokens_total{engine_type="trtllm",model_name="llama",token_position="1"} 600.0
# HELP trtllm_spec_decode_acceptance_length Mean acceptance length.
# TYPE trtllm_spec_decode_acceptance_length gauge
trtllm_spec_decode_acceptance_length{engine_type="trtllm",model_name="llama"} 2.4
"""  # noqa: E501


def test_trtllm_per_position_counters_give_steps_and_positions():
    """Position 0's drafted tokens are the verify steps; a position never accepted counts 0;
    the token totals are the per-position sums when the num_* counters are absent."""
    page = read_page(TRTLLM_POSITIONS, families("trtllm"))
    assert page.bad_lines == 0
    counts = page.series[("llama", "")].counts
    assert counts == Counts(1000.0, 3000.0, 1400.0, (800.0, 600.0, 0.0))
    r = ratios(counts)
    assert r.mean_acceptance_length == 2.4  # = its own acceptance-length gauge
    assert r.per_position == (0.8, 0.6, 0.0)
    with_totals = TRTLLM_POSITIONS + TRTLLM_PAGE.replace('engine="0"', 'engine_type="trtllm"')
    assert read_page(with_totals, families("trtllm")).series[("llama", "")].counts == Counts(
        1000.0, 3000.0, 1800.0, (800.0, 600.0, 0.0)
    )  # the num_* counters, where present, are the totals


def test_trtllm_positions_with_a_gap_are_refused():
    gap = TRTLLM_POSITIONS.replace('token_position="1"} 1000.0', 'token_position="5"} 1000.0')
    page = read_page(gap, families("trtllm"))
    assert page.series == {} and page.bad_lines == 1


def test_unknown_engine_kind():
    with pytest.raises(ValueError, match="unknown engine 'tgi'"):
        families("tgi")


def test_unknown_families_under_the_lead_are_ignored():
    text = one_engine() + f'{LEAD}emitted_tokens_total{{engine="0",model_name="{MODEL}"}} 5\n'
    page = read_page(text, VLLM)
    assert page.bad_lines == 0
    assert page.series[(MODEL, "0")].counts.accepted == BASE_ACCEPTED


def test_missing_family_skips_the_series_and_counts_it():
    text = drop_lines(one_engine(), lambda line: line.startswith(f"{LEAD}accepted_tokens_total"))
    page = read_page(text, VLLM)
    assert page.series == {}
    assert page.bad_lines == 1


def test_gap_in_positions_skips_the_series_and_counts_it():
    text = drop_lines(
        one_engine(),
        lambda line: line.startswith(f"{LEAD}accepted_tokens_per_pos_total") and '"1"' in line,
    )
    page = read_page(text, VLLM)
    assert page.series == {}
    assert page.bad_lines == 1


def test_an_incomplete_engine_does_not_take_the_others_with_it():
    text = drop_lines(
        four_engines(),
        lambda line: line.startswith(f"{LEAD}drafts_total") and 'engine="2"' in line,
    )
    page = read_page(text, VLLM)
    assert sorted(page.series) == [(MODEL, "0"), (MODEL, "1"), (MODEL, "3")]
    assert page.bad_lines == 1


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("family", ["drafts", "draft_tokens", "accepted_tokens"])
def test_impossible_counter_values_are_bad(family, value):
    text = rewrite(one_engine(), lambda f, _l, v: value if f == family else v)
    page = read_page(text, VLLM)
    assert page.series == {}
    assert page.bad_lines == 1


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf")])
@pytest.mark.parametrize("position", ["0", "2"])
def test_impossible_per_position_value_drops_the_series(position, value):
    """A bad *last* position must not pass the series off as one with a smaller k."""
    text = rewrite(
        one_engine(),
        lambda f, labels, v: (
            value if f == "accepted_tokens_per_pos" and labels["position"] == position else v
        ),
    )
    page = read_page(text, VLLM)
    assert page.series == {}
    assert page.bad_lines == 1


@pytest.mark.parametrize("position", ["x", "-1", "1.0", "²", "", "9" * 5000])
def test_garbage_position_label_is_bad(position):
    labels = f'engine="7",model_name="m",position="{position}"'
    text = one_engine() + f"{LEAD}accepted_tokens_per_pos_total{{{labels}}} 1\n"
    page = read_page(text, VLLM)
    assert page.bad_lines == 1
    assert list(page.series) == [(MODEL, "0")]


def _series_lines(engine: str, k: int, value: float = 1.0) -> str:
    labels = f'engine="{engine}",model_name="m"'
    lines = [
        f"{LEAD}drafts_total{{{labels}}} {value}",
        f"{LEAD}draft_tokens_total{{{labels}}} {value}",
        f"{LEAD}accepted_tokens_total{{{labels}}} {value}",
    ]
    lines += [
        f'{LEAD}accepted_tokens_per_pos_total{{{labels},position="{i}"}} {value}' for i in range(k)
    ]
    return "\n".join(lines) + "\n"


def test_max_positions():
    page = read_page(_series_lines("0", MAX_POSITIONS), VLLM)
    assert page.bad_lines == 0
    assert len(page.series[("m", "0")].counts.per_position) == MAX_POSITIONS
    page = read_page(_series_lines("0", MAX_POSITIONS + 1), VLLM)
    assert page.bad_lines == 1  # position 32 is beyond any real k: garbage
    assert page.series == {}


def test_max_series():
    text = "".join(_series_lines(str(i), 2) for i in range(MAX_SERIES + 3))
    page = read_page(text, VLLM)
    assert len(page.series) == MAX_SERIES
    assert ("m", str(MAX_SERIES - 1)) in page.series
    assert ("m", str(MAX_SERIES)) not in page.series
    assert page.bad_lines == 3 * 5  # every sample of the 3 series beyond the bound


def test_missing_labels_group_under_empty_strings():
    text = f"{LEAD}drafts_total 1\n{LEAD}draft_tokens_total 3\n{LEAD}accepted_tokens_total 2\n"
    page = read_page(text, VLLM)
    assert page.series[("", "")].counts == Counts(1.0, 3.0, 2.0, ())


def test_malformed_lines_are_counted_and_the_rest_still_read():
    text = one_engine() + f"{LEAD}drafts_total{{engine=\n{LEAD}accepted_tokens_total 1_0\n"
    page = read_page(text, VLLM)
    assert page.bad_lines == 2
    assert page.series[(MODEL, "0")].counts.drafts == BASE_DRAFTS


_LABEL_VALUES = ["0", "1", "2", "31", "32", "-1", "²", "٣", "x", "", "9" * 5000]
label_values = st.one_of(
    st.sampled_from(_LABEL_VALUES), st.sampled_from(_LABEL_VALUES), st.text(max_size=8)
)
sample_values = st.one_of(
    st.integers(0, 10**6),
    st.floats(),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1_0", "1e400", "-0", "x", ""]),
)


@st.composite
def sample_line(draw):
    """A spec-decode sample line, well-formed or nearly so, with hostile label/values."""
    family = draw(
        st.sampled_from(["drafts", "draft_tokens", "accepted_tokens", "x"])
        | st.just("accepted_tokens_per_pos")
    )
    suffix = draw(st.sampled_from(["_total", "_created", ""]))
    keys = draw(st.permutations(["engine", "model_name", "position", "le"]))
    keys = keys[: draw(st.integers(0, 4))]
    labels = ",".join(f'{k}="{draw(label_values)}"' for k in keys)
    value = draw(sample_values)
    return f"{LEAD}{family}{suffix}{{{labels}}} {value}"


page_text = st.lists(
    st.one_of(sample_line(), st.text(max_size=40), st.just(f"# HELP {LEAD}drafts_total x")),
    min_size=1,
    max_size=30,
).map("\n".join)


@settings(max_examples=200, deadline=None)
@given(text=page_text, kind=st.sampled_from(["vllm", "llamacpp", "trtllm"]))
def test_read_page_never_raises(text, kind):
    fams = families(kind)
    page = read_page(text.replace(LEAD, fams.lead), fams)
    assert page.bad_lines >= 0
    for raw in page.series.values():
        c = raw.counts
        assert all(0 <= v < float("inf") for v in (c.draft_tokens, c.accepted, *c.per_position))
        if kind != "trtllm":
            assert c.drafts is not None


def test_a_trtllm_that_drafted_nothing_yet_has_zero_steps_not_unknown():
    """At start TensorRT-LLM has token counters at 0 and no position series (one appears when
    a position is first drafted): that is 0 steps, or the routes' estimates, apportioned from
    the work since the sidecar's first sight, would never get any steps."""
    labels = '{model_name="llama",engine_type="pytorch"}'
    page = (
        f"trtllm_spec_decode_num_draft_tokens_total{labels} 0.0\n"
        f"trtllm_spec_decode_num_accepted_tokens_total{labels} 0.0\n"
    )
    (series,) = read_page(page, families("trtllm")).series.values()
    assert series.counts == Counts(0.0, 0.0, 0.0, ())


def test_trtllms_acceptance_length_gauge_is_kept_as_a_gauge():
    """The engine's own gauge is reported as it is, never read as a counter (no restart logic,
    no windows): specdec_engine_reported_acceptance_length."""
    labels = '{model_name="llama",engine_type="pytorch"}'
    page = read_page(
        f"trtllm_spec_decode_num_draft_tokens_total{labels} 30.0\n"
        f"trtllm_spec_decode_num_accepted_tokens_total{labels} 12.0\n"
        f"trtllm_spec_decode_acceptance_length{labels} 2.2\n",
        families("trtllm"),
    )
    assert page.gauges == {("llama", ""): {"acceptance_length": 2.2}}
    assert page.series[("llama", "")].counts == Counts(None, 30.0, 12.0, ())


def test_sglang_gives_steps_and_generated_tokens_and_keeps_its_gauges():
    page = read_page(SGLANG_PAGE.format(streamed=700, whole=300, verify=400), families("sglang"))
    assert page.bad_lines == 0
    counts = page.series[("qwen", "")].counts
    assert counts == Counts(400.0, None, None, (), generated=1000.0)  # no placeholder zeros
    assert ratios(counts) == Ratios(None, 2.5, None)  # tokens per step, no acceptance
    assert page.gauges == {("qwen", ""): {"acceptance_length": 2.5, "acceptance_rate": 0.5}}


def test_sglang_gauges_of_several_ranks_are_averaged():
    ranks = 'engine_type="unified",model_name="qwen",moe_ep_rank="0",pp_rank="0"'
    page = SGLANG_PAGE.format(streamed=1, whole=1, verify=1)
    page += f'sglang:spec_accept_rate{{{ranks},tp_rank="1",dp_rank="1"}} 0.7\n'
    gauges = read_page(page, families("sglang")).gauges
    assert gauges[("qwen", "")]["acceptance_rate"] == pytest.approx(0.6)


def test_sglang_without_verify_calls_is_speculation_off():
    only_tokens = "\n".join(
        line
        for line in SGLANG_PAGE.format(streamed=7, whole=3, verify=0).splitlines()
        if "generation_tokens" in line
    )
    assert read_page(only_tokens + "\n", families("sglang")).series == {}


def test_an_sglang_restart_is_seen_in_its_generated_tokens_too():
    store = RunningTotals()
    fams = families("sglang")
    store.feed(read_page(SGLANG_PAGE.format(streamed=700, whole=300, verify=400), fams))
    # the verify calls grew past the old value, the tokens did not: a restart in between
    restarted = store.feed(read_page(SGLANG_PAGE.format(streamed=50, whole=50, verify=450), fams))
    assert restarted == [("qwen", "")]
    assert store.series[("qwen", "")].counts.generated == 1100.0
