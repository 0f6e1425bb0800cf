"""The targeted line scanner: finds exactly the lead's samples, parses them like Prometheus
does, counts malformed lines instead of raising, and never raises on any text."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from exporter.scrape.exposition import Sample, parse_line, scan

from .pages import LEAD, MODEL, four_engines, one_engine

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference_samples(text: str, lead: str) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    """The lead's samples as prometheus_client's general parser sees them."""
    return sorted(
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(lead)
    )


def ours(text: str, lead: str) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    found = scan(text, (lead,))
    assert found.bad_lines == 0
    return sorted((s.name, tuple(sorted(s.labels)), s.value) for s in found.samples)


@pytest.mark.parametrize(
    ("page", "expected_count"),
    [
        # 3 counters + 3 _created, 3 positions x (counter + _created)
        (one_engine, 12),
        # 4 engines x (3 counters + 3 _created) + 4 engines x 5 positions x 2
        (four_engines, 64),
    ],
)
def test_scan_finds_exactly_the_spec_decode_samples_of_the_fixture_pages(page, expected_count):
    text = page()
    reference = reference_samples(text, LEAD)
    assert len(reference) == expected_count
    assert ours(text, LEAD) == reference


def test_scan_keeps_label_order_and_values_of_the_page():
    found = scan(one_engine(), (LEAD,))
    by_name = {(s.name, s.labels): s.value for s in found.samples}
    drafts = ("vllm:spec_decode_num_drafts_total", (("engine", "0"), ("model_name", MODEL)))
    assert by_name[drafts] == 1.2e6
    key = (
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        (("engine", "0"), ("model_name", MODEL), ("position", "2")),
    )
    assert by_name[key] == 460000.0
    created = ("vllm:spec_decode_num_drafts_created", (("engine", "0"), ("model_name", MODEL)))
    assert by_name[created] == 1.7959617596088421e09


def test_scan_other_leads_find_other_families():
    found = scan(one_engine(), ("process_",))
    names = {s.name for s in found.samples}
    assert "process_cpu_seconds_total" in names
    assert not any(n.startswith("vllm:") for n in names)
    assert scan(one_engine(), ("no_such_family_",)).samples == []


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (r"a\"b", 'a"b'),
        (r"a\\b", "a\\b"),
        (r"a\nb", "a\nb"),
        (r"a\\nb", "a\\nb"),  # an escaped backslash followed by a plain n
        (r"\\\"", '\\"'),
        (r"x\ty", r"x\ty"),  # unknown escape: kept as is, like Prometheus
        ("a}b,c=d", "a}b,c=d"),
        ("", ""),
    ],
)
def test_label_value_escapes(raw, expected):
    line = f'{LEAD}drafts_total{{model_name="{raw}",engine="0"}} 5'
    sample = parse_line(line)
    assert sample == Sample(f"{LEAD}drafts_total", (("model_name", expected), ("engine", "0")), 5.0)
    if "\\t" not in raw:  # the reference parser agrees on every defined escape
        [(_, labels, value)] = reference_samples(line + "\n", LEAD)
        assert dict(labels)["model_name"] == expected
        assert value == 5.0


@pytest.mark.parametrize(
    ("line", "value"),
    [
        (f"{LEAD}drafts_total 7 1700000000000", 7.0),
        (f'{LEAD}drafts_total{{engine="0"}} 7 1700000000000', 7.0),
        (f'{LEAD}drafts_total{{engine="0"}}\t7\t-5', 7.0),
        (f"{LEAD}drafts_total 1.5e+06", 1.5e6),
        (f"{LEAD}drafts_total{{}} 3", 3.0),
        (f'{LEAD}drafts_total{{ engine = "0" , model_name="m" }} 4', 4.0),
    ],
)
def test_values_and_timestamps(line, value):
    sample = parse_line(line)
    assert sample is not None
    assert sample.value == value


def test_special_values_parse_as_floats():
    assert math.isnan(parse_line(f"{LEAD}drafts_total NaN").value)
    assert parse_line(f"{LEAD}drafts_total +Inf").value == math.inf
    assert parse_line(f"{LEAD}drafts_total -Inf").value == -math.inf


def test_comment_and_help_lines_holding_the_lead_are_not_samples():
    text = (
        f"# HELP {LEAD}drafts_total Number of spec decoding drafts.\n"
        f"# TYPE {LEAD}drafts_total counter\n"
        f'# {LEAD}drafts_total{{engine="0"}} 999\n'
        f"#{LEAD}drafts_total 999\n"
        f'x{LEAD}drafts_total{{engine="0"}} 999\n'
        f'{LEAD}drafts_total{{engine="0"}} 1\n'
    )
    found = scan(text, (LEAD,))
    assert found.bad_lines == 0
    assert [s.value for s in found.samples] == [1.0]


MALFORMED = [
    pytest.param(f'{LEAD}drafts_total{{engine="0"}}', id="missing-value"),
    pytest.param(f'{LEAD}drafts_total{{engine="0"}} ', id="missing-value-trailing-space"),
    pytest.param(f"{LEAD}drafts_total 1.2.3", id="bad-float"),
    pytest.param(f"{LEAD}drafts_total one", id="word-value"),
    pytest.param(f"{LEAD}drafts_total 1_000", id="underscore-digits"),
    pytest.param(f'{LEAD}drafts_total{{engine="0}} 1', id="unterminated-label-value"),
    pytest.param(f'{LEAD}drafts_total{{engine="0" 1', id="unterminated-label-set"),
    pytest.param(f"{LEAD}drafts_total{{engine=0}} 1", id="unquoted-label-value"),
    pytest.param(f'{LEAD}drafts_total{{engine="0",}} 1', id="trailing-comma"),
    pytest.param(f'{LEAD}drafts_total{{="0"}} 1', id="empty-label-name"),
    pytest.param(f"{LEAD}drafts_total 1 2 junk", id="junk-after-timestamp"),
    pytest.param(f"{LEAD}drafts_total 1 junk", id="junk-after-value"),
    pytest.param(f"{LEAD}drafts_total 1 1_000", id="underscore-timestamp"),
    pytest.param(f'{LEAD}drafts_total{{engine="0"}}1', id="no-space-before-value"),
    pytest.param(f"{LEAD}drafts_total # 1", id="comment-as-value"),
]


@pytest.mark.parametrize("line", MALFORMED)
def test_malformed_line_is_none(line):
    assert parse_line(line) is None


def test_malformed_lines_are_counted_and_skipped():
    good = f'{LEAD}drafts_total{{engine="0"}} 5\n'
    text = good + "".join(p.values[0] + "\n" + good for p in MALFORMED)
    found = scan(text, (LEAD,))
    assert found.bad_lines == len(MALFORMED)
    assert [s.value for s in found.samples] == [5.0] * (len(MALFORMED) + 1)


def test_lead_at_the_very_start_and_at_the_very_end_without_newline():
    text = f"{LEAD}drafts_total 1\n# comment\nother_metric 2\n{LEAD}draft_tokens_total 3"
    found = scan(text, (LEAD,))
    assert [(s.name, s.value) for s in found.samples] == [
        (f"{LEAD}drafts_total", 1.0),
        (f"{LEAD}draft_tokens_total", 3.0),
    ]
    assert found.bad_lines == 0


def test_truncated_last_line_is_bad_not_a_crash():
    found = scan(f'{LEAD}drafts_total 1\n{LEAD}draft_tokens_total{{engine="0', (LEAD,))
    assert [s.value for s in found.samples] == [1.0]
    assert found.bad_lines == 1


def test_crlf_lines():
    text = f'# HELP x y\r\n{LEAD}drafts_total{{engine="0"}} 1\r\n{LEAD}accepted_tokens_total 2\r\n'
    found = scan(text, (LEAD,))
    assert found.bad_lines == 0
    assert found.samples == [
        Sample(f"{LEAD}drafts_total", (("engine", "0"),), 1.0),
        Sample(f"{LEAD}accepted_tokens_total", (), 2.0),
    ]


def test_whole_fixture_page_with_crlf_gives_the_same_samples():
    text = one_engine()
    assert scan(text.replace("\n", "\r\n"), (LEAD,)) == scan(text, (LEAD,))


def test_empty_text_and_lead_alone():
    assert scan("", (LEAD,)).samples == []
    found = scan(LEAD, (LEAD,))
    assert (found.samples, found.bad_lines) == ([], 1)


# --- fuzz -------------------------------------------------------------------------------------

FRAGMENTS = [
    LEAD,
    "drafts_total",
    "accepted_tokens_per_pos_total",
    "_created",
    "model_name",
    "engine",
    "position",
    "{",
    "}",
    '"',
    "=",
    ",",
    "\\",
    " ",
    "\t",
    "\n",
    "\r\n",
    "#",
    "0",
    "1",
    "7",
    ".",
    "e",
    "-",
    "+",
    "_",
    "NaN",
    "+Inf",
    "-Inf",
    "²",
    "é",
    "\x00",
]
fragment_text = st.lists(st.sampled_from(FRAGMENTS), max_size=60).map("".join)
any_text = st.one_of(st.text(max_size=300), fragment_text)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _render(sample: Sample) -> str:
    labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sample.labels)
    return f"{sample.name}{{{labels}}} {sample.value!r}"


def _same(a: Sample, b: Sample) -> bool:
    both_nan = math.isnan(a.value) and math.isnan(b.value)
    return a.name == b.name and a.labels == b.labels and (both_nan or a.value == b.value)


@FUZZ
@given(text=any_text)
def test_scan_never_raises_and_accounts_for_every_lead_line(text):
    found = scan(text, (LEAD,))
    lead_lines = sum(1 for line in text.split("\n") if line.startswith(LEAD))
    assert len(found.samples) + found.bad_lines == lead_lines
    for sample in found.samples:
        assert sample.name.startswith(LEAD)
        assert isinstance(sample.value, float)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in sample.labels)
        # a parsed sample renders back to a line that parses to the same sample
        again = parse_line(_render(sample))
        assert again is not None and _same(again, sample)


@FUZZ
@given(text=any_text)
def test_parse_line_never_raises(text):
    sample = parse_line(text)
    if sample is not None:
        assert text.startswith(sample.name)
        again = parse_line(_render(sample))
        assert again is not None and _same(again, sample)


@settings(max_examples=150, deadline=None)
@given(
    name=st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,20}", fullmatch=True),
    labels=st.lists(
        st.tuples(st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,10}", fullmatch=True), st.text()),
        max_size=4,
    ),
    value=st.floats(allow_nan=False),
)
def test_any_well_formed_sample_parses_back(name, labels, value):
    sample = Sample(name, tuple(labels), value)
    assert parse_line(_render(sample)) == sample
