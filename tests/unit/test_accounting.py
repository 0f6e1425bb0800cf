"""Per-route accounting in process: exact objects add up, the model_name label cap, and `apportion`
handing the engine's unexplained work to estimated routes (their sum is the engine's, shares
follow the estimates, nothing ever goes down)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.accounting.ledger import Accounting, RequestOutcome
from exporter.config import ModelConfig
from exporter.core.counts import Counts
from exporter.core.windows import DEFAULT_WINDOWS
from exporter.proxy.labels import MAX_MODEL_NAME, OTHER_MODEL, ModelLabels

M = "m"


def accounting(k: int | None = 3) -> Accounting:
    models = {} if k is None else {M: ModelConfig(M, k, 1.78)}
    return Accounting(("a", "b", "other"), DEFAULT_WINDOWS, models)


def estimated(route: str, increments: tuple[int, ...], model: str = M) -> RequestOutcome:
    tokens = sum(increments)
    return RequestOutcome(route, model, "200", tokens, increments=increments)


def vector(c: Counts) -> tuple[float, ...]:
    return (c.drafts or 0.0, c.draft_tokens, c.accepted, *c.per_position)


def test_exact_objects_add_up_per_route_and_only_for_200s() -> None:
    acc = accounting()
    one = Counts(10, 30, 12, (6, 4, 2))
    acc.record(RequestOutcome("a", M, "200", 22, exact=one))
    acc.record(RequestOutcome("a", M, "200", 22, exact=one))
    acc.record(RequestOutcome("a", M, "499", 0, exact=one))  # a hang-up counts, not its work
    assert acc.exact[("a", M)] == one + one
    assert acc.requests[("a", M, "200", "other")] == 2
    assert acc.requests[("a", M, "499", "other")] == 1
    assert acc.generation_tokens[("a", M)] == 44


def test_model_names_are_capped_then_other() -> None:
    given = ModelLabels(limit=16)
    names = [f"model-{i}" for i in range(20)]
    labels = [given.label(n) for n in names]
    assert labels[:16] == names[:16]
    assert labels[16:] == [OTHER_MODEL] * 4
    assert given.label("model-3") == "model-3"  # a known name keeps its label
    assert given.label(None) == "" and given.label("") == ""
    assert len(given.names) == 16


@pytest.mark.parametrize(
    "name", ["m" * (MAX_MODEL_NAME + 1), "bad\x00byte", "lone\ud800surrogate", "tab\tname"]
)
def test_a_model_name_that_would_break_the_page_is_other_and_takes_no_slot(name: str) -> None:
    given = ModelLabels(limit=1)
    assert given.label(name) == OTHER_MODEL
    assert given.label("served") == "served"  # the one slot is still free


def test_apportion_gives_the_unexplained_work_by_estimated_steps_and_accepted() -> None:
    acc = accounting(k=3)
    exact = Counts(4, 12, 6, (3, 2, 1))
    acc.record(RequestOutcome("a", M, "200", 10, exact=exact))
    # b: two steps of 4 tokens (3 accepted each); other: four steps of 1 token (0 accepted)
    acc.record(estimated("b", (1, 4, 4)))
    acc.record(estimated("other", (1, 1, 1, 1, 1)))
    engine = exact + Counts(6, 18, 6, (2, 2, 2))
    acc.apportion({M: engine})
    b, other = acc.estimated[("b", M)], acc.estimated[("other", M)]
    assert ("a", M) not in acc.estimated  # an exact route receives no estimate
    # drafts, draft tokens and positions follow the steps (2 : 4), accepted the accepted (6 : 0)
    assert vector(b) == pytest.approx((2, 6, 6, 2 / 3, 2 / 3, 2 / 3))
    assert vector(other) == pytest.approx((4, 12, 0, 4 / 3, 4 / 3, 4 / 3))
    assert vector(b + other + exact) == pytest.approx(vector(engine))


def test_a_route_without_streamed_increments_takes_its_own_or_the_engines_tokens_per_step() -> None:
    acc = accounting(k=3)
    acc.record(estimated("b", (1, 4, 4)))  # b streams at 4 tokens per step
    acc.record(RequestOutcome("b", M, "200", 8))  # non-streamed: 8 tokens -> 2 more steps
    acc.record(RequestOutcome("other", M, "200", 8))  # streamed nothing: engine's average
    engine = Counts(10, 30, 20, (8, 7, 5))  # 3 tokens per step
    acc.apportion({M: engine})
    b, other = acc.estimated[("b", M)], acc.estimated[("other", M)]
    steps_b, steps_other = 2 + 8 / 4, 8 / 3
    assert b.drafts == pytest.approx(10 * steps_b / (steps_b + steps_other))
    assert vector(b + other) == pytest.approx(vector(engine))


def test_an_engine_without_model_names_is_every_models() -> None:
    """llama.cpp's counters carry no model_name (one model per server): its work goes to the
    routes whatever model name their responses gave, less what exact requests explain."""
    acc = accounting(k=3)
    exact = Counts(2, 6, 3, (2, 1, 0))
    acc.record(RequestOutcome("a", "tiny", "200", 10, exact=exact))
    acc.record(estimated("b", (1, 4, 4), model="tiny"))
    engine = exact + Counts(2, 6, 6, (2, 2, 2))
    acc.apportion({"": engine})
    assert vector(acc.estimated[("b", "tiny")]) == pytest.approx((2, 6, 6, 2, 2, 2))


def test_llama_cpp_timings_make_the_routes_tokens_exact() -> None:
    """Requests that carry their own draft and accepted tokens (llama.cpp's timings): those
    are each route's exact counts (and its request-level view); its steps and positions are
    apportioned, weighed at the engine's draft tokens per step."""
    acc = accounting(k=3)
    acc.record(RequestOutcome("a", "tiny", "200", 10, drafted=(9, 6)))
    acc.record(RequestOutcome("b", "tiny", "200", 10, drafted=(3, 0)))
    acc.record(RequestOutcome("b", "tiny", "200", 10, drafted=(6, 2)))
    engine = Counts(6, 18, 8, (5, 2, 1))  # 3 draft tokens per step
    acc.apportion({"": engine})
    exact_a, exact_b = acc.exact[("a", "tiny")], acc.exact[("b", "tiny")]
    assert (exact_a.drafts, exact_a.draft_tokens, exact_a.accepted) == (0, 9, 6)
    assert (exact_b.drafts, exact_b.draft_tokens, exact_b.accepted) == (0, 9, 2)
    a, b = acc.estimated[("a", "tiny")], acc.estimated[("b", "tiny")]
    assert (a.drafts, b.drafts) == pytest.approx((3, 3))
    assert (a.draft_tokens + b.draft_tokens, a.accepted + b.accepted) == pytest.approx((0, 0))
    assert [m.requests for m in (acc.moments[("a", "tiny")], acc.moments[("b", "tiny")])] == [1, 2]


def test_llama_cpp_work_no_request_explains_goes_by_the_routes_own_accepted_tokens() -> None:
    """Requests cut short (the client left before llama.cpp's timings came) leave their
    accepted tokens unexplained: each route takes them as its own exact ones would have it,
    so a low-acceptance route's acceptance stays near its own (evenly: run 23's voice read
    0.40 for its exact 0.36)."""
    acc = accounting(k=3)
    acc.record(RequestOutcome("a", "tiny", "200", 40, drafted=(30, 24)))  # 0.8
    acc.record(RequestOutcome("b", "tiny", "200", 40, drafted=(30, 6)))  # 0.2
    cut = Counts(4, 12, 6)  # two cut requests' work: one a's (0.8 x 6), one b's (0.2 x 6)
    acc.apportion({"": Counts(20, 60, 30) + cut})
    a, b = acc.estimated[("a", "tiny")], acc.estimated[("b", "tiny")]
    assert (a.accepted, b.accepted) == pytest.approx((6 * 24 / 30, 6 * 6 / 30))
    assert (a.draft_tokens, b.draft_tokens) == pytest.approx((6, 6))
    for route, own in (("a", 0.8), ("b", 0.2)):
        whole = acc.exact[(route, "tiny")] + acc.estimated[(route, "tiny")]
        assert whole.accepted / whole.draft_tokens == pytest.approx(own, abs=0.03)


def test_apportion_keeps_models_apart_and_needs_estimates() -> None:
    acc = accounting()
    acc.record(estimated("b", (1, 2, 2), model="m2"))
    acc.apportion({M: Counts(5, 15, 5, (3, 1, 1)), "m2": Counts(2, 6, 2, (1, 1, 0))})
    assert set(acc.estimated) == {("b", "m2")}  # nobody estimated on M: nothing to hand out
    assert vector(acc.estimated[("b", "m2")]) == pytest.approx((2, 6, 2, 1, 1, 0))


def test_apportion_ignores_engines_without_drafts() -> None:
    acc = accounting()
    acc.record(estimated("b", (1, 2, 2)))
    acc.apportion({M: Counts(None, 15, 5)})  # TensorRT-LLM counts no verify steps
    acc.apportion({M: Counts(0, 0, 0)})
    assert acc.estimated == {}


@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["b", "other"]),
            st.lists(st.integers(1, 4), min_size=2, max_size=6),
            st.integers(0, 3),  # the engine's extra work in steps, this tick
        ),
        min_size=1,
        max_size=12,
    )
)
@settings(max_examples=150, deadline=None)
def test_estimates_never_go_down_and_never_exceed_the_engine(
    steps: list[tuple[str, list[int], int]],
) -> None:
    acc = accounting(k=3)
    engine = Counts(0, 0, 0, (0, 0, 0))
    before: dict[tuple[str, str], tuple[float, ...]] = {}
    for route, increments, extra in steps:
        acc.record(estimated(route, tuple(increments)))
        work = sum(increments[1:])
        steps_made = len(increments) - 1 + extra
        accepted = max(0, work - steps_made)
        engine = engine + Counts(steps_made, 3 * steps_made, accepted, (accepted, 0, 0))
        acc.apportion({M: engine})
        for key, counts in acc.estimated.items():
            now = vector(counts)
            assert all(n >= b - 1e-9 for n, b in zip(now, before.get(key, ()), strict=False))
            before[key] = now
        total = [sum(x) for x in zip(*(vector(c) for c in acc.estimated.values()), strict=True)]
        assert all(t <= e + 1e-6 for t, e in zip(total, vector(engine), strict=True))


def test_the_request_level_view_of_exact_requests() -> None:
    acc = accounting(k=3)  # step cost 1.78
    requests = [  # (drafts, draft tokens, accepted, finish)
        (10, 30, 27, "length"),  # acceptance 0.9, 3.7 tokens/step: pays; not a loop (< 0.95)
        (10, 30, 30, "length"),  # 1.0 and cut by max_tokens: a loop
        (10, 30, 30, "stop"),  # 1.0 but it ended by itself: not a loop
        (10, 30, 3, "stop"),  # 0.1: 1.3 tokens/step < 1.78, speculation made it slower
        (0, 0, 0, "stop"),  # no drafts: no moments, no histogram
    ]
    for drafts, tokens, accepted, finish in requests:
        exact = Counts(drafts, tokens, accepted, (0, 0, 0))
        acc.record(RequestOutcome("a", M, "200", 40, finish_reason=finish, exact=exact))
    moments = acc.moments[("a", M)]
    assert moments.requests == 4 and moments.accepted == 90 and moments.draft_tokens == 120
    assert moments.accepted_squared == 27**2 + 30**2 + 30**2 + 3**2
    assert moments.draft_tokens_squared == 4 * 900
    assert moments.accepted_times_draft_tokens == 30 * 90
    histogram = dict(acc.acceptance[("a", M)].read().cumulative())
    assert histogram["+Inf"] == 4 and histogram["0.1"] == 1 and histogram["0.9"] == 2
    assert acc.below_breakeven[("a", M)] == 1
    assert acc.runaway[("a", M)] == 1
    assert acc.requests[("a", M, "200", "length")] == 2
    assert acc.requests[("a", M, "200", "stop")] == 3


def test_finish_reasons_are_bounded() -> None:
    from exporter.accounting.ledger import finish_label

    assert [finish_label(r) for r in ("stop", "length", "tool_calls", "abort")] == [
        "stop",
        "length",
        "tool_calls",
        "abort",
    ]
    assert finish_label("content_filter") == "other" and finish_label(None) == "other"
    assert finish_label(["stop"]) == "other"
