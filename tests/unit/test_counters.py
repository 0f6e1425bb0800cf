"""Restart-safe running sums: never decrease, and equal the engines' true work across restarts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.core.counts import Counts
from exporter.scrape.families import Page, RawSeries, families, read_page
from exporter.scrape.totals import RunningTotals, is_restart

from .pages import MODEL, bump, one_engine, set_counts, shift_created

KEY = ("m", "0")
STAMPS = (("accepted", 100.0), ("draft_tokens", 100.0), ("drafts", 100.0))


def page(counts: Counts, created=STAMPS, key=KEY, **more: Counts) -> Page:
    series = {key: RawSeries(counts, tuple(created))}
    series.update({("m", engine): RawSeries(c, tuple(created)) for engine, c in more.items()})
    return Page(series, 0)


def fed(*pages: Page) -> RunningTotals:
    store = RunningTotals()
    for p in pages:
        store.feed(p)
    return store


def test_first_sight_is_the_lifetime_value():
    store = RunningTotals()
    assert store.feed(page(Counts(10, 30, 15, (8, 5, 2)))) == []
    assert store.snapshot() == {KEY: Counts(10, 30, 15, (8, 5, 2))}
    totals = store.series[KEY]
    assert (totals.rejected, totals.restarts) == (15, 0)


def test_normal_increase():
    store = fed(page(Counts(10, 30, 15, (8, 5, 2))))
    assert store.feed(page(Counts(25, 75, 40, (20, 13, 7)))) == []
    assert store.snapshot()[KEY] == Counts(25, 75, 40, (20, 13, 7))
    assert store.series[KEY].rejected == 35


def test_unchanged_page_adds_nothing():
    store = fed(*[page(Counts(10, 30, 15, (8, 5, 2)))] * 5)
    assert store.snapshot()[KEY] == Counts(10, 30, 15, (8, 5, 2))
    assert store.series[KEY].restarts == 0


@pytest.mark.parametrize(
    "after",
    [
        Counts(5, 60, 30, (20, 8, 2)),  # drafts went down
        Counts(20, 28, 20, (12, 6, 2)),  # draft tokens went down
        Counts(20, 60, 6, (20, 8, 2)),  # accepted went down
        Counts(20, 60, 30, (20, 8, 1)),  # one position went down
    ],
)
def test_a_decrease_is_a_restart_and_the_increase_is_the_new_value(after):
    before = Counts(10, 30, 15, (8, 5, 2))
    store = fed(page(before))
    assert store.feed(page(after)) == [KEY]
    totals = store.series[KEY]
    assert totals.restarts == 1
    assert totals.counts == before + after
    assert totals.rejected == before.rejected + after.rejected
    assert totals.last.counts == after


def test_sums_never_decrease_across_restarts():
    readings = [Counts(10, 30, 15, (9, 6)), Counts(3, 9, 4, (3, 1)), Counts(1, 3, 0, (0, 0))]
    store = RunningTotals()
    previous = None
    for r in readings:
        store.feed(page(r))
        now = store.snapshot()[KEY]
        if previous is not None:
            assert now.drafts >= previous.drafts
            assert now.draft_tokens >= previous.draft_tokens
            assert now.accepted >= previous.accepted
            assert all(a >= b for a, b in zip(now.per_position, previous.per_position, strict=True))
        previous = now
    assert store.snapshot()[KEY] == Counts(14, 42, 19, (12, 7))
    assert store.series[KEY].restarts == 2


def test_changed_created_with_unchanged_values_is_a_restart():
    counts = Counts(10, 30, 15, (8, 5, 2))
    store = fed(page(counts))
    restarted = [(n, v + 60.0) if n == "drafts" else (n, v) for n, v in STAMPS]
    assert store.feed(page(counts, created=restarted)) == [KEY]
    assert store.snapshot()[KEY] == counts + counts
    assert store.series[KEY].restarts == 1


def test_created_appearing_or_vanishing_is_not_a_restart():
    """`_created` disappears with --api-server-count > 1; only a *changed* stamp counts."""
    counts = Counts(10, 30, 15, ())
    store = fed(page(counts, created=()))
    assert store.feed(page(Counts(11, 33, 16, ()), created=STAMPS)) == []
    assert store.feed(page(Counts(12, 36, 17, ()), created=())) == []
    assert store.snapshot()[KEY] == Counts(12, 36, 17, ())
    assert store.series[KEY].restarts == 0


def test_restart_by_created_on_real_pages():
    fams = families("vllm")
    before = one_engine()
    after = shift_created(before, 3600.0)  # same numbers, a new engine start time
    assert is_restart(
        read_page(before, fams).series[(MODEL, "0")], read_page(after, fams).series[(MODEL, "0")]
    )
    store = fed(read_page(before, fams), read_page(after, fams))
    assert store.snapshot()[(MODEL, "0")].drafts == 2 * 1.2e6
    later = bump(before, drafts=5)
    assert not is_restart(
        read_page(before, fams).series[(MODEL, "0")], read_page(later, fams).series[(MODEL, "0")]
    )


def test_torn_read_does_not_make_rejected_go_down():
    # accepted counted before the draft tokens it belongs to: accepted - draft tokens
    # momentarily grows by 10
    store = fed(page(Counts(10, 100, 50, ())))
    rejected = [store.series[KEY].rejected]
    for reading in (Counts(10, 100, 60, ()), Counts(12, 120, 60, ()), Counts(20, 200, 100, ())):
        store.feed(page(reading))
        rejected.append(store.series[KEY].rejected)
    assert rejected == [50, 50, 60, 100]  # flat over the torn read, then exact again
    assert store.series[KEY].restarts == 0


def test_torn_read_the_other_way_does_not_leave_rejected_too_high():
    # draft tokens counted before accepted: rejected looks 20 too high for one scrape
    store = fed(page(Counts(10, 100, 50, ())))
    store.feed(page(Counts(10, 120, 50, ())))
    assert store.series[KEY].rejected == 70
    store.feed(page(Counts(12, 120, 70, ())))
    assert store.series[KEY].rejected == 70  # never goes down
    store.feed(page(Counts(20, 200, 110, ())))
    # once the engine's real rejected count passes the torn peak, the sum is exact again
    assert store.series[KEY].rejected == 200 - 110


def test_positions_vanishing_without_restart_signs_skip_the_page():
    first = Counts(10, 30, 15, (8, 5, 2))
    store = fed(page(first))
    # an incomplete page: position 2 missing, counters up, no _created change
    assert store.feed(page(Counts(20, 60, 30, (16, 10)))) == []
    assert store.snapshot()[KEY] == first
    assert store.series[KEY].last.counts == first
    # when the full page returns, the increase since `first` is counted exactly once
    final = Counts(30, 90, 45, (24, 15, 6))
    store.feed(page(final))
    assert store.snapshot()[KEY] == final
    assert store.series[KEY].restarts == 0


def test_positions_vanishing_with_a_decrease_is_a_restart():
    first = Counts(10, 30, 15, (8, 5, 2))
    store = fed(page(first))
    assert store.feed(page(Counts(2, 4, 3, (2, 1)))) == [KEY]  # restarted with k=2
    assert store.snapshot()[KEY] == Counts(12, 34, 18, (10, 6, 2))


def test_series_disappearing_and_reappearing_lower_is_a_restart():
    first = Counts(10, 30, 15, ())
    store = fed(page(first))
    store.feed(Page({}, 0))  # scraped while the engine was gone
    assert store.snapshot()[KEY] == first
    assert store.feed(page(Counts(1, 3, 2, ()))) == [KEY]
    assert store.snapshot()[KEY] == Counts(11, 33, 17, ())


def test_series_are_independent():
    store = fed(page(Counts(10, 30, 15, ()), **{"1": Counts(100, 300, 150, ())}))
    restarted = store.feed(page(Counts(1, 3, 2, ()), **{"1": Counts(110, 330, 165, ())}))
    assert restarted == [KEY]
    assert store.snapshot() == {
        KEY: Counts(11, 33, 17, ()),
        ("m", "1"): Counts(110, 330, 165, ()),
    }


def test_trtllm_series_without_drafts():
    store = fed(page(Counts(None, 30, 15, ())), page(Counts(None, 10, 5, ())))
    assert store.snapshot()[KEY] == Counts(None, 40, 20, ())
    assert store.series[KEY].restarts == 1


def test_reset_on_real_pages_counts_the_new_value():
    fams = families("vllm")
    before = one_engine()
    after = set_counts(before, 100, 300, 150, (70, 50, 30))
    store = fed(read_page(before, fams), read_page(after, fams))
    assert store.snapshot()[(MODEL, "0")] == Counts(
        1.2e6 + 100, 3.6e6 + 300, 2.04e6 + 150, (900070.0, 680050.0, 460030.0)
    )


# --- property: any sequence of engine lives ------------------------------------------------


@st.composite
def increments(draw, k: int) -> Counts:
    accepted = draw(st.integers(0, 1000))
    rejected = draw(st.integers(0, 1000))
    return Counts(
        float(draw(st.integers(0, 1000))),
        float(accepted + rejected),
        float(accepted),
        tuple(float(draw(st.integers(0, 1000))) for _ in range(k)),
    )


@st.composite
def engine_lives(draw):
    """[(created stamp, [readings])]: each life monotone; each restart detectable, either by a
    changed `_created` or by a first reading below the previous life's last."""
    k = draw(st.integers(0, 3))
    lives = []
    stamp = 1000.0
    for i in range(draw(st.integers(1, 4))):
        first = draw(increments(k))
        if i > 0:
            previous_last = lives[-1][1][-1]
            went_down = any(
                a < b
                for a, b in zip(
                    (first.drafts, first.draft_tokens, first.accepted, *first.per_position),
                    (
                        previous_last.drafts,
                        previous_last.draft_tokens,
                        previous_last.accepted,
                        *previous_last.per_position,
                    ),
                    strict=True,
                )
            )
            if not went_down or draw(st.booleans()):
                stamp += draw(st.integers(1, 10**6))
        readings = [first]
        for _ in range(draw(st.integers(0, 5))):
            readings.append(readings[-1] + draw(increments(k)))
        lives.append((stamp, readings))
    return lives


def _fields(c: Counts) -> tuple[float, ...]:
    return (c.drafts, c.draft_tokens, c.accepted, *c.per_position)


@settings(max_examples=300, deadline=None)
@given(lives=engine_lives())
def test_sums_equal_the_true_work_over_any_sequence_of_lives(lives):
    store = RunningTotals()
    previous: tuple[tuple[float, ...], float] | None = None
    for stamp, readings in lives:
        created = (("accepted", stamp), ("draft_tokens", stamp), ("drafts", stamp))
        for reading in readings:
            store.feed(page(reading, created=created))
            now = (_fields(store.snapshot()[KEY]), store.series[KEY].rejected)
            if previous is not None:  # monotone non-decreasing, field by field
                assert all(a >= b for a, b in zip(now[0], previous[0], strict=True))
                assert now[1] >= previous[1]
            previous = now
    # first life: its lifetime value at first sight plus its increases = its last reading;
    # each later life: everything it counted from zero = its last reading
    (_, first_life), *later = lives
    truth = first_life[-1]
    for _, readings in later:
        truth = truth + readings[-1]
    totals = store.series[KEY]
    assert totals.counts == truth
    assert totals.restarts == len(lives) - 1
    assert totals.rejected == truth.draft_tokens - truth.accepted
