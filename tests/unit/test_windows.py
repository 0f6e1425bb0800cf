"""Rolling windows against hand-computed numbers.

Pages are the 1-engine fixture with known increments at known timestamps (every 10 s); the
expected figures below are worked out by hand in the comments, not by the code under test.
Base values of the fixture: drafts 1.2e6, draft tokens 3.6e6, accepted 2.04e6,
per position 900000 / 680000 / 460000.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.config import Target
from exporter.core.counts import Counts, ratios
from exporter.core.windows import DEFAULT_WINDOWS, History, Window, parse_window
from exporter.export.target_collector import TargetCollector
from exporter.scrape.target import TargetState

from .pages import MODEL, bump, four_engines, one_engine

M1, M5, M15 = (parse_window(w) for w in ("1m", "5m", "15m"))
KEY = (MODEL, "0")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("1m", 60),
        ("5m", 300),
        ("15m", 900),
        ("1h", 3600),
        ("1h30m", 5400),
        ("1m30s", 90),
        ("2h0m5s", 7205),
        ("500ms", 0.5),  # Prometheus' grammar: ms, d, w, y too
        ("1d", 86400),
        ("1w2d", 9 * 86400),
        ("1y", 365 * 86400),
        ("1m500ms", 60.5),
    ],
)
def test_parse_window(text, seconds):
    assert parse_window(text) == Window(text, float(seconds))


@pytest.mark.parametrize(
    "text",
    ["", "5x", "5", "m", "1.5m", "-1m", " 5m", "5m ", "0m", "0s", "30s1m", "1h1h", "5ms1s", "1D"],
)
def test_parse_window_rejects(text):
    with pytest.raises(ValueError):
        parse_window(text)


def test_default_windows():
    assert [(w.label, w.seconds) for w in DEFAULT_WINDOWS] == [
        ("1m", 60.0),
        ("5m", 300.0),
        ("15m", 900.0),
    ]


def new_state(windows=(M1, M5, M15)) -> TargetState:
    return TargetState(Target(name="gpu0", url="http://127.0.0.1:8000/metrics"), tuple(windows))


def steady_page(i: int) -> str:
    """After i steps of 10 s: +100 drafts, +300 draft tokens, +150 accepted, +70/50/30."""
    return bump(one_engine(), 100 * i, 300 * i, 150 * i, (70 * i, 50 * i, 30 * i))


@pytest.fixture(scope="module")
def steady() -> TargetState:
    """Pages at t = 0, 10, ..., 120 s."""
    state = new_state()
    for i in range(13):
        state.ingest(steady_page(i), float(10 * i))
    return state


def test_one_minute_at_the_last_snapshot(steady):
    # baseline t=60 (i=6), end t=120 (i=12): 6 steps
    inc = steady.history.increase(M1, 120.0)
    assert inc == {KEY: Counts(600.0, 1800.0, 900.0, (420.0, 300.0, 180.0))}
    r = ratios(inc[KEY])
    assert r.acceptance == pytest.approx(900 / 1800)  # 0.5
    assert r.mean_acceptance_length == pytest.approx(1 + 900 / 600)  # 2.5
    assert r.per_position == pytest.approx((0.7, 0.5, 0.3))


def test_a_window_longer_than_the_history_has_no_figure_unless_asked_for_as_partial(steady):
    # 5m and 15m reach back before t=0: no 5m figure from 2 minutes of history...
    for window in (M5, M15):
        assert steady.history.increase(window, 120.0) == {}
        # ...unless the caller takes the partial span (t=0 to t=120, 12 steps) and says so
        inc = steady.history.increase(window, 120.0, partial=True)
        assert inc == {KEY: Counts(1200.0, 3600.0, 1800.0, (840.0, 600.0, 360.0))}
        assert steady.history.covered(window, 120.0) == 120.0
    assert steady.history.covered(M1, 120.0) == 60.0


def test_now_between_snapshots(steady):
    # now=125: window starts at 65 -> newest snapshot at or before it is t=60: 6 steps
    assert steady.history.increase(M1, 125.0)[KEY].drafts == 600.0
    # now=131: starts at 71 -> baseline t=70, end still t=120: 5 steps
    assert steady.history.increase(M1, 131.0) == {
        KEY: Counts(500.0, 1500.0, 750.0, (350.0, 250.0, 150.0))
    }


def test_no_drafts_in_the_window_gives_no_ratios(steady):
    # now=180: the window starts at the last snapshot (t=120): nothing happened since
    inc = steady.history.increase(M1, 180.0)
    assert inc == {KEY: Counts(0.0, 0.0, 0.0, (0.0, 0.0, 0.0))}
    r = ratios(inc[KEY])
    assert (r.acceptance, r.mean_acceptance_length, r.per_position) == (None, None, None)


def test_last_snapshot_older_than_the_window_is_dropped(steady):
    assert steady.history.increase(M1, 180.5) == {}
    assert steady.history.increase(M5, 420.0) != {}
    assert steady.history.increase(M5, 420.5) == {}
    assert steady.history.increase(M15, 1020.5) == {}


def test_idle_engine_gives_no_ratios():
    state = new_state()
    for t in range(0, 130, 10):
        state.ingest(one_engine(), float(t))  # the counters never move
    inc = state.history.increase(M1, 120.0)
    assert inc[KEY] == Counts(0.0, 0.0, 0.0, (0.0, 0.0, 0.0))
    assert ratios(inc[KEY]).acceptance is None


def phased_page(i: int) -> str:
    """Steps 1..20: +100 drafts, +300 draft tokens, +150 accepted, per position +70/50/30.
    Steps 21..: +100 drafts, +300 draft tokens, +60 accepted, per position +40/15/5."""
    early, late = min(i, 20), max(i - 20, 0)
    return bump(
        one_engine(),
        100 * i,
        300 * i,
        150 * early + 60 * late,
        (70 * early + 40 * late, 50 * early + 15 * late, 30 * early + 5 * late),
    )


@pytest.fixture(scope="module")
def phased() -> TargetState:
    """Pages at t = 0, 10, ..., 300 s."""
    state = new_state()
    for i in range(31):
        state.ingest(phased_page(i), float(10 * i))
    return state


def test_windows_of_different_length_see_different_traffic(phased):
    # 1m at 300: steps 25..30, all late: 600 drafts, 1800 tokens, 6 x 60 = 360 accepted
    one = ratios(phased.history.increase(M1, 300.0)[KEY])
    assert one.acceptance == pytest.approx(360 / 1800)  # 0.2
    assert one.mean_acceptance_length == pytest.approx(1.6)
    assert one.per_position == pytest.approx((240 / 600, 90 / 600, 30 / 600))
    # 5m at 300: baseline t=0; 20 early + 10 late steps:
    # drafts 3000, tokens 9000, accepted 3000 + 600 = 3600, positions 1800 / 1150 / 650
    five = phased.history.increase(M5, 300.0)[KEY]
    assert five == Counts(3000.0, 9000.0, 3600.0, (1800.0, 1150.0, 650.0))
    r = ratios(five)
    assert r.acceptance == pytest.approx(0.4)
    assert r.mean_acceptance_length == pytest.approx(2.2)
    assert r.per_position == pytest.approx((0.6, 1150 / 3000, 650 / 3000))


def test_window_straddling_the_change():
    state = new_state()
    for i in range(26):  # up to t=250
        state.ingest(phased_page(i), float(10 * i))
    # 1m at 250: baseline t=190 (i=19), end t=250 (i=25): step 20 early, 21..25 late
    # accepted 150 + 5 x 60 = 450, positions 70+200 / 50+75 / 30+25
    inc = state.history.increase(M1, 250.0)[KEY]
    assert inc == Counts(600.0, 1800.0, 450.0, (270.0, 125.0, 55.0))
    r = ratios(inc)
    assert r.acceptance == pytest.approx(0.25)
    assert r.mean_acceptance_length == pytest.approx(1.75)


def test_old_snapshots_are_pruned_but_the_longest_window_still_right():
    state = new_state(windows=(M1, M5))
    for i in range(121):  # 0 .. 1200 s
        state.ingest(steady_page(i), float(10 * i))
    assert len(state.history._ring) <= 32  # 5 min of 10 s snapshots, plus the baseline
    assert state.history.increase(M5, 1200.0)[KEY].drafts == 3000.0  # 30 steps
    assert state.history.increase(M1, 1200.0)[KEY].drafts == 600.0


def second_model(i: int) -> str:
    """Model "draft-b" (k=3): lifetime 5000/15000/6000 (3000/2000/1000) when first seen,
    then +10 drafts, +30 tokens, +12 accepted, +6/4/2 per 10 s step."""
    labels = 'engine="0",model_name="draft-b"'
    lead = "vllm:spec_decode_num_"
    pos = (3000 + 6 * i, 2000 + 4 * i, 1000 + 2 * i)
    return (
        f"{lead}drafts_total{{{labels}}} {5000 + 10 * i}\n"
        f"{lead}draft_tokens_total{{{labels}}} {15000 + 30 * i}\n"
        f"{lead}accepted_tokens_total{{{labels}}} {6000 + 12 * i}\n"
        + "".join(
            f'{lead}accepted_tokens_per_pos_total{{{labels},position="{p}"}} {v}\n'
            for p, v in enumerate(pos)
        )
    )


def test_series_first_appearing_mid_window():
    state = new_state()
    for i in range(13):  # model b appears at t=90 (its step 0)
        extra = second_model(i - 9) if i >= 9 else ""
        state.ingest(steady_page(i) + extra, float(10 * i))
    inc = state.history.increase(M1, 120.0)
    # model a as before; model b from its first snapshot (t=90) to t=120: 3 steps,
    # not its lifetime value
    assert inc[KEY].drafts == 600.0
    assert inc[("draft-b", "0")] == Counts(30.0, 90.0, 36.0, (18.0, 12.0, 6.0))
    r = ratios(inc[("draft-b", "0")])
    assert r.acceptance == pytest.approx(0.4)
    assert r.mean_acceptance_length == pytest.approx(2.2)


def test_series_seen_only_in_the_newest_snapshot_has_no_increase_yet():
    state = new_state()
    for i in range(7):
        state.ingest(steady_page(i), 10.0 * i)
    state.ingest(steady_page(7) + second_model(0), 70.0)
    assert set(state.history.increase(M1, 70.0)) == {KEY}


def test_empty_history():
    assert History((M1,)).increase(M1, 0.0) == {}


# --- the per-model sum over engines, through the collector ------------------------------------

# per 10 s step, every engine: +100 drafts, +500 draft tokens; accepted and per position:
ENGINE_STEPS = {
    "0": (100, (60, 30, 10, 0, 0)),
    "1": (200, (90, 60, 30, 15, 5)),
    "2": (300, (100, 80, 60, 40, 20)),
    "3": (400, (100, 100, 90, 60, 50)),
}


def four_engine_page(i: int) -> str:
    text = four_engines()
    for engine, (accepted, per_pos) in ENGINE_STEPS.items():
        text = bump(text, 100 * i, 500 * i, accepted * i, [p * i for p in per_pos], [engine])
    return text


def gauges(state: TargetState, now: float) -> dict[tuple[str, tuple], float]:
    registry = CollectorRegistry()
    registry.register(TargetCollector([state], clock=lambda: now))
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        if family.type == "gauge"
        for s in family.samples
    }


def test_engine_all_sums_the_engines_of_a_model():
    state = new_state()
    for i in range(13):
        state.ingest(four_engine_page(i), float(10 * i))
    found = gauges(state, 120.0)

    def gauge(name, engine, window="1m", **extra):
        labels = {"target": "gpu0", "model_name": MODEL, "engine": engine, "window": window}
        return found[(name, tuple(sorted({**labels, **extra}.items())))]

    # 1m at 120: 6 steps. engine 0: 600 drafts, 3000 tokens, 600 accepted
    assert gauge("specdec_acceptance_ratio", "0") == pytest.approx(0.2)
    assert gauge("specdec_mean_acceptance_length", "0") == pytest.approx(2.0)
    # engine 3: 2400 accepted
    assert gauge("specdec_acceptance_ratio", "3") == pytest.approx(0.8)
    assert gauge("specdec_mean_acceptance_length", "3") == pytest.approx(5.0)
    # all: 2400 drafts, 12000 tokens, 6 x 1000 = 6000 accepted; positions 6 x 350/270/190/115/75
    assert gauge("specdec_acceptance_ratio", "all") == pytest.approx(0.5)
    assert gauge("specdec_mean_acceptance_length", "all") == pytest.approx(3.5)
    expected = (0.875, 0.675, 0.475, 0.2875, 0.1875)
    for position, value in enumerate(expected):
        assert gauge(
            "specdec_position_acceptance_ratio", "all", position=str(position)
        ) == pytest.approx(value)
    # 5m and 15m at 120: the sidecar has 2 minutes of history, not 5: no figure yet
    assert not [k for k in found if ("window", "5m") in k[1] or ("window", "15m") in k[1]]
    # the "all" series are one per model and window
    all_series = [k for k in found if ("engine", "all") in k[1]]
    assert len(all_series) == 1 * (2 + 5)  # the 1m window x (ratio, length, 5 positions)


def test_stale_target_loses_its_gauges_after_the_window():
    state = new_state(windows=(M1,))
    for i in range(13):
        state.ingest(steady_page(i), float(10 * i))
    assert ("specdec_acceptance_ratio" in {k[0] for k in gauges(state, 150.0)}) is True
    names = {k[0] for k in gauges(state, 181.0)}  # the target stopped answering at 120
    assert "specdec_acceptance_ratio" not in names
    assert "specdec_mean_acceptance_length" not in names


def test_a_series_born_at_zero_inside_the_window_counts_whole():
    """The proxy's route sums start at zero: a route first seen mid-window did all its work in
    the window (an engine's lifetime counters first seen mid-life count from that sight)."""
    window = Window("1m", 60.0)
    key = ("voice_chat", "m")
    for born_at_zero, want in ((True, 30.0), (False, 10.0)):
        history: History[tuple[str, str], Counts] = History([window], born_at_zero=born_at_zero)
        history.record(0.0, {})
        history.record(50.0, {})
        history.record(70.0, {key: Counts(20.0, 60.0, 30.0)})
        history.record(80.0, {key: Counts(30.0, 90.0, 45.0)})
        assert history.increase(window, 80.0)[key].drafts == want


def test_a_reload_that_adds_a_window_keeps_the_others_figures() -> None:
    """SIGHUP with `windows:` changed: the kept 1m window keeps its figure at once (it vanished
    until new traffic came before); the new 15m one appears once the history covers it."""
    state = new_state((M1,))
    for i in range(13):
        state.ingest(steady_page(i), float(10 * i))
    before = state.history.increase(M1, 120.0)
    state = state.carried(state.target, (M1, M15))
    assert state.history.increase(M1, 120.0) == before != {}
    assert state.history.increase(M15, 120.0) == {}  # 2 minutes of history: not 15 yet
    for i in range(13, 13 + 6 * 14):
        state.ingest(steady_page(i), float(10 * i))
    assert state.history.increase(M15, float(10 * (12 + 6 * 14))) != {}
