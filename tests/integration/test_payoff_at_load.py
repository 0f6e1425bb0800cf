"""The payoff at the load it runs, against an A/B measurement on simulators.

A speculative simulator (k = 3) and a plain one (k = 0) of the same model; `specdec measure
--concurrency 1,8,32` against both gives the step-time curve, which configures `specdec serve`
(the sidecar scraping the speculative simulator, the proxy in front of it with two routes).
At each concurrency the same closed-loop traffic of the two routes (Japanese voice chat, a
coding agent) runs through the proxy against the speculative engine, then directly against
the plain one, twice, alternating (spec, plain, spec, plain: a 2-core machine's load
drifts). Per route, the sidecar's load-aware estimate and its measured speedup are each within
5 % of the A/B truth (the route's decode rate with / without speculation at the same
load, as the clients saw it), widened by the A/B's own error: half the distance between its two
rounds, at most 10 % more (on a 2-core host shared with other tests one round can run in a
slow spell the other did not). The simulator's own account (`/admin/truth`: every verify step's
seconds against a plain step's in the same engine state) is printed beside them, not held to
the A/B: a plain engine at the same concurrency holds fewer prefills a step (its requests
last longer), which a same-state counterfactual does not see; with long prompts it read 13-30 %
over the A/B.

Four times: with one k; with the speculative simulator running a dynamic schedule (vLLM's
`num_speculative_tokens_per_batch_size`, as `specdec advise` prints it): k = 3 at c = 1, 2 at
c = 8, and no drafts at c = 32, where the payoff is x1.0 (neither a gap nor a fake figure)
and the models: block carries the schedule; and with the live traffic at 4x the context
measure's traffic had, and at a quarter of it (measure's requests lengthened instead). The
simulator's steps read every running request's KV and take in new requests' prefills, so
the live step is not measure's: the sidecar reads the curve at the live context (measure's
phases at two contexts give a step's cost per token of it), and the plain step now through
the cost ratio there. Below measure's contexts the curve is extrapolated from two phases'
difference, each with the noise of a short phase of prefill-heavy steps: at c = 32 on this
host it read within -8..+10 % of the A/B in four runs. There either figure is within 5 %, or
within the half-width the sidecar states for it (the acceptance's interval widened by the
curve's drift from the live step: an extrapolated step off the live one shows as drift) and
that half-width within 15 %.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from harness.ab_traffic import ROUTES, Decoded, alternate, measured, routes_pack, sidecar
from harness.helpers import child, free_port, http_get, specdec, wait_for
from harness.pages import Page, samples, value

LEVELS = (1, 8, 32)
SCHEDULE = "[[1, 3, 3], [4, 15, 2], [16, 256, 0]]"
# the simulators run SPEED x faster than the modelled 27B engine (each request keeps the
# modelled timeline on a busy host: `sim.decoder.Pace`); every span of the test scales with it,
# so a phase holds the requests a 12 s phase holds at real time
SPEED = 2.0
PHASE = 12.0 / SPEED  # seconds of one phase
WINDOW = (
    40.0 / SPEED
)  # the sidecar's window: both speculative phases of a level (spec, plain, spec)
INTERVAL = 0.5 / SPEED  # the sidecar's scrape interval
TOLERANCE = 0.05
BAND = 0.15  # the widest half-width that still says something, as a share of the speedup

pytestmark = pytest.mark.timeout(900)


@dataclass(frozen=True)
class Case:
    name: str
    schedule: str = ""  # the speculative simulator's, "" for one k
    measured_longer: int = 0  # words of context more in measure's requests
    live_longer: int = 0  # in the live traffic's

    @property
    def extrapolated(self) -> bool:
        """The live context below measure's shortest: the curve read by extrapolation (4x
        measure's context lies within its two phases' contexts)."""
        return self.measured_longer > 0


# the scenarios' requests hold ~150 tokens of context on the simulator (its prompts ~100 tokens,
# half their decode); 200 words of the filler are ~450 tokens more: 4x
FOUR_TIMES = 200
CASES = [
    Case("one-k"),
    Case("schedule", schedule=SCHEDULE),
    Case("live-4x-context", live_longer=FOUR_TIMES),
    Case("live-quarter-context", measured_longer=FOUR_TIMES),
]


@dataclass
class Rig:
    spec: str
    plain: str
    proxy: str
    metrics: str
    started: float  # when the sidecar came up
    case: Case


@pytest.fixture(scope="module", params=CASES, ids=[c.name for c in CASES])
def rig(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Rig]:
    case: Case = request.param
    schedule = case.schedule
    tmp = tmp_path_factory.mktemp("payoff")
    spec_port, plain_port = free_port(), free_port()
    spec, plain = f"http://127.0.0.1:{spec_port}", f"http://127.0.0.1:{plain_port}"
    scheduled = ("--schedule", schedule) if schedule else ()
    sim = ("sim", "--speed", f"{SPEED:g}", "--listen")
    with (
        child(specdec(*sim, f"127.0.0.1:{spec_port}", *scheduled), tmp / "spec.log"),
        child(
            specdec(*sim, f"127.0.0.1:{plain_port}", "--num-speculative-tokens", "0"),
            tmp / "plain.log",
        ),  # fmt: skip
    ):
        for url in (spec, plain):
            wait_for(lambda u=url: http_get(u + "/v1/models"), what=f"{url} up")
        levels = measured(spec, plain, routes_pack(tmp, case.measured_longer), LEVELS)
        with sidecar(tmp, spec_port, levels, WINDOW, INTERVAL, schedule) as (proxy, metrics):
            started = time.monotonic()
            yield Rig(spec, plain, proxy, metrics, started, case)


def band(page: Page, labels: dict[str, str]) -> float | None:
    """The half-width the sidecar states for the route's speedup: its option at the k the
    steps ran (the one equal to the estimate), the acceptance's interval widened by the
    curve's drift; None where it states none (no speculative option)."""
    estimated = value(page, "specdec_route_estimated_speedup_ratio", **labels)
    for (name, key), option in page.items():
        found = dict(key)
        if (
            name == "specdec_route_speedup_at_draft_length_ratio"
            and labels.items() <= found.items()
            and found["draft_length"] != "0"
            and estimated is not None
            and option == pytest.approx(estimated, rel=1e-9)
        ):
            return value(page, "specdec_route_speedup_at_draft_length_ci_halfwidth", **found)
    return None


def truth(url: str) -> dict[str, dict[str, float]]:
    data = json.loads(http_get(url + "/admin/truth"))
    return {name: t["decode"] for name, t in data.items()}


def delta_speedup(before: dict[str, float], after: dict[str, float]) -> float:
    d = {k: after[k] - before.get(k, 0.0) for k in ("steps", "tokens", "seconds", "plain_seconds")}
    return (d["tokens"] / d["seconds"]) / (d["steps"] / d["plain_seconds"])


@pytest.mark.parametrize("concurrency", LEVELS)
def test_the_payoff_at_load_agrees_with_the_ab_truth(rig: Rig, concurrency: int) -> None:
    # the sidecar's window is full by the time the last speculative phase ends
    young = WINDOW - 3 * PHASE + 2 / SPEED
    wait_for(lambda: time.monotonic() - rig.started > young, timeout=young + 5, what="history")
    before = truth(rig.spec)

    def read() -> tuple[Page, dict[str, dict[str, float]]]:
        return samples(http_get(rig.metrics)), truth(rig.spec)

    rounds: list[tuple[dict[str, Decoded], dict[str, Decoded]]] = []
    spec, plain, seen = alternate(
        rig.proxy, rig.plain, "sim-27b", concurrency, PHASE, read, rounds, rig.case.live_longer
    )
    page, after = seen
    report = []
    unsettled: dict[str, float] = {}  # the A/B's own error: half its two rounds' distance
    for route in ROUTES:
        ab = spec[route].rate / plain[route].rate
        halves = [on[route].rate / off[route].rate for on, off in rounds]
        unsettled[route] = min((max(halves) - min(halves)) / 2, (BAND - TOLERANCE) * ab)
        profile = ROUTES[route].scenario  # the simulator's profile for its prompts
        sim = delta_speedup(before[profile], after[profile])
        labels = {"route": route, "model_name": "sim-27b", "window": f"{WINDOW:.0f}s"}
        estimated = value(page, "specdec_route_estimated_speedup_ratio", **labels)
        measured = value(page, "specdec_route_speedup_ratio", **labels)
        report.append((route, concurrency, ab, sim, estimated, measured, band(page, labels)))
    drift = value(page, "specdec_model_curve_drift_ratio", model_name="sim-27b")
    print(report, "drift", drift, "the A/B's rounds' half-distance", unsettled)
    running = value(page, "specdec_engine_running_requests", target="sim", engine="0")
    assert running is not None
    for route, c, ab, _, estimated, measured, half in report:
        assert estimated is not None and measured is not None, (route, c)
        for name, figure in (("estimated", estimated), ("measured", measured)):
            if rig.case.extrapolated and half is not None and abs(figure - ab) > TOLERANCE * ab:
                # read off measure's contexts: the band the sidecar states covers the truth
                # (and says something: a band of +-15 % would cover anything here)
                assert abs(figure - ab) <= half <= BAND * figure, (route, c, name, report)
                continue
            # within 5 % of the A/B, widened by as much as the A/B itself is unsettled: its two
            # rounds on a 2-core host shared by other tests can differ by ~10 % (up to a 15 %
            # band in all, beyond which the check would say nothing)
            assert abs(figure - ab) <= TOLERANCE * ab + unsettled[route], (route, c, name, report)
    if rig.case.schedule:  # the options by draft length are for the k the schedule runs here
        k = {1: 3, 8: 2, 32: 0}[concurrency]
        for route, *_, estimated, _, _ in report:
            labels = {"route": route, "model_name": "sim-27b", "window": f"{WINDOW:.0f}s"}
            options = {
                int(dict(key)["draft_length"]): v
                for (name, key), v in page.items()
                if name == "specdec_route_speedup_at_draft_length_ratio"
                and labels.items() <= dict(key).items()
            }
            # k = 0: plain steps only, no acceptance to build options on (nothing, not 1.0s)
            assert sorted(options) == (list(range(k + 1)) if k else []), (route, options)
            if k:  # the observed steps' k: its option is the route's speedup
                assert options[k] == pytest.approx(estimated, rel=0.02), (route, options)
    if rig.case.schedule and concurrency == 32:  # the schedule's k = 0: plain steps, x1.0
        # ... but for the phases' drains, where the batch falls below 16 and the last requests
        # (mostly the agent's longer ones) draft at k = 2-3: the window straddles the bands by
        # that much, which the simulator's own account of the same phases says (`sim`): x1.0
        # is held to within that and 5 %. A route shown paying while speculation is off fails.
        for route, _, ab, sim, estimated, measured, _ in report:
            assert ab == pytest.approx(1.0, rel=TOLERANCE), (route, report)
            for figure in (estimated, measured):
                assert abs(figure - 1.0) <= TOLERANCE + abs(sim - 1.0), (route, report)
        return
    if concurrency == 32:  # at a large batch the low-acceptance route loses
        voice = next(r for r in report if r[0] == "voice_chat")
        assert voice[2] < 1.0 and voice[4] < 1.0, report
