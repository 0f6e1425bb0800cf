"""The GPU bench's own logic (bench/gpu/), which CI cannot run on a GPU: the A/B's rules (rounds
until two agree, the outlier named, never averaged in), the traffic's route assignment and
request fields, the patch applier, the measure pack and the table."""

from __future__ import annotations

import json
import statistics
import tarfile
from pathlib import Path
from typing import Any

import pytest

from bench.gpu import build, product, sweep, table
from bench.gpu.rounds import (
    Rate,
    Round,
    agree,
    agreeing_pair,
    best,
    outliers,
    settled,
    truth,
    verdict,
    within,
)
from bench.gpu.servers import Launch, Models, command
from bench.gpu.traffic import AGENT, ROUTES, VOICE, assignment, spread
from exporter.config import load
from exporter.measure.scenarios import load_file


def rnd(spec: dict[str, float], plain: dict[str, float], seconds: float = 10.0) -> Round:
    """A round whose routes decoded at the given tok/s (10 s of decode each)."""
    return Round(
        {r: Rate(v * seconds, seconds, 5) for r, v in spec.items()},
        {r: Rate(v * seconds, seconds, 5) for r, v in plain.items()},
    )


def test_two_rounds_within_5_percent_agree_and_are_pooled() -> None:
    rounds = [rnd({"a": 110}, {"a": 100}), rnd({"a": 114}, {"a": 100})]
    assert agree(1.10, 1.14) and not agree(1.10, 1.16)
    assert agreeing_pair(rounds, "a") == (0, 1)
    assert settled(rounds, ["a"])
    assert truth(rounds, "a", (0, 1)) == pytest.approx(224 / 200)


def test_a_round_that_moved_is_named_and_left_out() -> None:
    # round 2's plain phase ran at a third of its usual rate (GPU_FACTS saw this once)
    rounds = [
        rnd({"a": 110}, {"a": 100}),
        rnd({"a": 111}, {"a": 33}),
        rnd({"a": 112}, {"a": 101}),
    ]
    assert agreeing_pair(rounds, "a") == (0, 2)
    v = verdict(rounds, "a")
    assert v.truth == pytest.approx(222 / 201)
    assert v.pair == (0, 2)
    assert len(v.outliers) == 1
    assert v.outliers[0].startswith("round 2: its plain phase ran at x0.33")


def test_no_agreeing_pair_is_no_truth() -> None:
    rounds = [rnd({"a": 110}, {"a": 100}), rnd({"a": 130}, {"a": 100})]
    assert not settled(rounds, ["a"])
    v = verdict(rounds, "a")
    assert v.truth is None and v.pair is None
    assert len(outliers(rounds, "a", None)) == 2


def test_every_route_must_settle() -> None:
    rounds = [
        rnd({"a": 110, "b": 90}, {"a": 100, "b": 100}),
        rnd({"a": 111, "b": 70}, {"a": 100, "b": 100}),
    ]
    assert agreeing_pair(rounds, "a") == (0, 1)
    assert not settled(rounds, ["a", "b"])


def test_within_and_best() -> None:
    assert within(1.09, 1.0, 0.10) and not within(1.11, 1.0, 0.10)
    assert within(None, 1.0, 0.1) is None
    assert best({0: 1.0, 1: 1.2, 2: 1.15}) == (1, pytest.approx(1.2 / 1.15 - 1))
    assert best({0: 1.0}) == (0, float("inf"))


def test_one_client_alternates_the_routes_more_split_them() -> None:
    assert assignment(ROUTES, 1) == [[VOICE, AGENT]]
    split = assignment(ROUTES, 4)
    assert [c[0].name for c in split] == ["voice_chat", "coding_agent"] * 2


def test_a_request_carries_its_routes_acceptance_and_draft_length() -> None:
    body = AGENT.body(3, 2)
    assert body["speculative.synth_rates"] == list(AGENT.rates)
    assert body["speculative.n_max"] == 2
    assert body["ignore_eos"] is True
    assert "speculative.n_max" not in VOICE.body(0, None)
    assert VOICE.acceptance == pytest.approx(0.36)
    assert AGENT.acceptance == pytest.approx(0.71)


def test_a_request_asks_its_routes_length_and_the_spread_flag_sets_it() -> None:
    """The lengths are the product's `Workload` (tests/unit/test_workload.py); the bench's
    requests carry them, and --length-spread 0 puts every request at its route's mean."""
    for route in (VOICE, AGENT):
        assert route.body(5, None)["max_tokens"] == route.tokens(5)
        fixed = spread([route], 0.0)[0]
        assert {fixed.tokens(i) for i in range(50)} == {route.mean_tokens}
        assert fixed.rates == route.rates


def test_measure_sees_a_routes_spread_as_scenarios_at_its_quantiles(tmp_path: Path) -> None:
    pack = product.scenario_pack(tmp_path / "pack.jsonl", ROUTES)
    scenarios = load_file(pack)
    names = [f"{r.name}_{j}" for r in ROUTES for j in range(4)]
    assert [s.name for s in scenarios] == names
    caps = [s.max_tokens for s in scenarios]
    assert caps == VOICE.caps(4) + AGENT.caps(4) and caps[:4] == sorted(caps[:4])
    assert statistics.fmean(caps[4:]) == pytest.approx(AGENT.mean_tokens, rel=0.1)
    voice = [p for s in scenarios[:4] for p in s.prompts]  # the route's 8 prompts, 2 a cap
    assert len(voice) == 8 and len(set(voice)) == 8
    assert dict(scenarios[5].extra_body)["speculative.synth_rates"] == list(AGENT.rates)
    # each route holds half of measure's batch, as of the A/B's: requests x length alike
    held = {r.name: sum(s.weight for s in scenarios if s.name.startswith(r.name)) * r.mean_tokens
            for r in ROUTES}  # fmt: skip
    assert held["voice_chat"] == pytest.approx(held["coding_agent"], rel=1e-3)
    assert {s.weight for s in scenarios[4:]} == {1.0}


def test_the_patch_applier_takes_a_unified_diff(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f.cpp").write_text("a\nb\nc\nd\n")
    patch = tmp_path / "p.patch"
    patch.write_text(
        "diff --git a/d/f.cpp b/d/f.cpp\n--- a/d/f.cpp\n+++ b/d/f.cpp\n"
        "@@ -1,4 +1,4 @@\n a\n-b\n+B\n c\n d\n"
    )
    build.apply_patch(src, patch)
    assert (src / "d" / "f.cpp").read_text() == "a\nB\nc\nd\n"
    build.apply_patch(src, patch)  # a second time: the marker says it is done
    assert (src / "d" / "f.cpp").read_text() == "a\nB\nc\nd\n"
    other = tmp_path / "other"
    (other / "d").mkdir(parents=True)
    (other / "d" / "f.cpp").write_text("x\n")
    with pytest.raises(build.BuildError, match=r"d/f\.cpp, hunk 1 does not apply"):
        build.apply_patch(other, patch)


def test_the_shipped_patch_parses_into_its_two_files() -> None:
    files = build.parse_patch(build.PATCH.read_text())
    assert [f for f, _ in files] == [
        "tools/server/server-context.cpp",
        "tools/server/server-schema.cpp",
    ]
    assert all(old and new and old != new for _, hunks in files for old, new in hunks)


def test_a_packed_tree_unpacks_to_its_source(tmp_path: Path) -> None:
    tree = tmp_path / "llama.cpp"
    (tree / "ggml" / "src" / "ggml-metal").mkdir(parents=True)
    (tree / "ggml" / "src" / "ggml-cuda").mkdir(parents=True)
    (tree / "docs").mkdir()
    (tree / "CMakeLists.txt").write_text("")
    build.trim(tree)
    assert not (tree / "docs").exists() and not (tree / "ggml" / "src" / "ggml-metal").exists()
    assert (tree / "ggml" / "src" / "ggml-cuda").is_dir()
    packed = tmp_path / "t.tgz"
    build.pack(tree, packed)
    assert build.unpack(packed, tmp_path / "out") == tmp_path / "out" / "llama.cpp"
    bad = tmp_path / "bad.tgz"
    with tarfile.open(bad, "w:gz") as tar:
        tar.add(packed, arcname="x")
    with pytest.raises(build.BuildError, match="neither an sdist"):
        build.unpack(bad, tmp_path / "out2")


def test_the_measure_pack_carries_each_routes_request_fields(tmp_path: Path) -> None:
    pack = product.scenario_pack(tmp_path / "pack.jsonl", spread(ROUTES, 0.0), prompts=3)
    scenarios = load_file(pack)
    assert [s.name for s in scenarios] == ["voice_chat", "coding_agent"]
    extra = dict(scenarios[1].extra_body)
    assert extra == {
        "ignore_eos": True,
        "cache_prompt": False,
        "speculative.synth_rates": list(AGENT.rates),
        "timings_per_token": True,
    }
    assert len(scenarios[0].prompts) == 3 and scenarios[0].max_tokens == VOICE.mean_tokens


PRINTED = """concurrency  running  s/step spec
1            1.0      0.0050

models:   # for the sidecar config (specdec serve --config)
  - name: bench
    num_speculative_tokens: 3
    step_cost_ratio: 1.85
    plain_decode_tokens_per_second: 214.0
    step_time:   # seconds per decode step against the engine's running requests
      - {running: 1.00, plain_seconds: 0.004673, verify_seconds: 0.008645}
      - {running: 15.80, plain_seconds: 0.008100, verify_seconds: 0.031000}
"""


def test_the_printed_block_makes_a_config_that_loads(tmp_path: Path) -> None:
    block = product.models_block(PRINTED)
    assert block.startswith("models:")
    assert product.curve(block)[1] == {
        "running": 15.8,
        "plain_seconds": 0.0081,
        "verify_seconds": 0.031,
    }
    path = tmp_path / "specdec.yaml"
    product.sidecar_config(path, "http://127.0.0.1:9", 9001, "11s", ROUTES, block)
    config = load(path)
    assert config.models[0].name == "bench" and len(config.models[0].step_time) == 2
    assert config.targets[0].kind == "llamacpp"
    assert [r.name for r in config.proxy.routes] == ["voice_chat", "coding_agent"]  # type: ignore[union-attr]
    with pytest.raises(RuntimeError, match="no models: block"):
        product.models_block("concurrency ...\n")


def page(request_seconds: float, batch_seconds: float) -> str:
    """A sidecar page: one route's window figures and the engine's batch counters."""
    route = 'model_name="bench",route="voice_chat",window="11s"'
    engine = 'engine="",model_name="bench",target="llamacpp"'
    return "\n".join(
        [
            f"specdec_route_estimated_speedup_ratio{{{route}}} 1.1",
            f"specdec_route_speedup_ratio{{{route}}} 1.09",
            f'specdec_route_speedup_at_draft_length_ratio{{draft_length="0",{route}}} 1.0',
            f'specdec_route_speedup_at_draft_length_ratio{{draft_length="1",{route}}} 1.2',
            f"specdec_route_best_draft_length{{{route}}} 1",
            f"specdec_engine_running_request_seconds_total{{{engine}}} {request_seconds}",
            f"specdec_engine_running_request_batch_seconds_total{{{engine}}} {batch_seconds}",
        ]
    )


def test_a_reading_is_the_routes_window_and_the_phases_batch() -> None:
    before, after = page(10, 40), page(170, 2600)  # 160 request-seconds at batch 16
    r = product.reading(before, after, "voice_chat", "11s")
    assert (r.estimated, r.measured, r.best_draft_length) == (1.1, 1.09, 1)
    assert r.by_draft_length == {0: 1.0, 1: 1.2}
    assert r.batch == pytest.approx(16.0)
    assert product.reading(before, after, "coding_agent", "11s").estimated is None


def test_the_table_shows_truth_sidecar_and_sweep() -> None:
    route = {
        "truth": 1.10,
        "rounds": [1.09, 1.30, 1.11],
        "pair": [0, 2],
        "outliers": ["round 2: its plain phase ran at x0.85 of the others'"],
        "estimated": 1.12,
        "measured": 1.13,
        "tokens_per_step": 2.07,
        "batch": 1.0,
        "by_draft_length": {1: 1.21, 2: 1.14},
        "best_draft_length": [1, 1],
    }
    data = {
        "args": {"k": "2"},
        "levels": [{"concurrency": 1, "routes": {"voice_chat": route}}],
        "alone": [],
        "sweep": [
            {
                "concurrency": 1,
                "route": "voice_chat",
                "mix": "mixed",
                "speedup": {0: 1.0, 1: 1.2, 2: 1.15},
                "best": 1,
                "lead": 0.043,
            }
        ],
    }
    text = table.report(json.loads(json.dumps(data)))  # as read back from results.json
    assert "x1.100" in text and "[1.090] 1.300 [1.110]" in text and "+1.8%" in text
    assert "round 2: its plain phase" in text
    assert "1 (+4.3%)" in text
    lines = text.splitlines()
    row = next(x.split() for x in lines if x.startswith("1 ") and "mixed" in x)
    assert row[:6] == ["1", "voice_chat", "mixed", "1.000", "1.200", "1.150"]
    # two readings of 1; no advise recorded; judged; the regret of following them, advise's
    assert row[-5:] == ["1/1", "-", "met", "0.0%", "-"]
    options = next(x.split() for x in lines if x.lstrip().startswith("sidecar"))
    assert options == ["sidecar", "-", "1.210", "1.140"]  # no k = 0 option: the plain engine
    # the sweep's k = 2 (the deployed k) against the mixed A/B's truth at that level
    assert "c=1 voice_chat: the sweep's k=2 x1.150 against the A/B's x1.100 (+4.5%)" in text
    assert lines[-3:] == [
        "Speedups: 2 of 2 within 10 % of the truth, 2 within 5 %; worst 2.7%",
        "Best draft length: 1 of 1 met (mixed sweep)",
        "Best draft length, worst regret (1 - true at the k named / true best): sidecar 0.0%",
    ]


def _route(**changes: Any) -> dict[str, Any]:
    """A level's figures for one route in results.json: truth 1.0 from two agreeing rounds,
    the sidecar on it, no options; `changes` over that."""
    base = {"truth": 1.0, "rounds": [1.0, 1.0], "pair": [0, 1], "outliers": [],
            "estimated": 1.0, "measured": 1.0, "tokens_per_step": 2.0, "batch": 1.0,
            "by_draft_length": {}}  # fmt: skip
    return {**base, **changes}


def _one_mixed_level(
    route: dict[str, Any], speedup: dict[int, float], advice: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A results document: voice alone in the A/B at c = 1 and its mixed sweep there."""
    level: dict[str, Any] = {"concurrency": 1, "routes": {"voice_chat": route}}
    if advice is not None:
        level["advise"] = advice
    found = sweep.best(speedup)
    return {"levels": [level], "alone": [],
            "sweep": [{"concurrency": 1, "route": "voice_chat", "mix": "mixed",
                       "speedup": speedup, "best": found and found[0],
                       "lead": found and found[1]}]}  # fmt: skip


def _mixed_row(data: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The table's mixed sweep row at c = 1, split, and all its lines."""
    lines = table.report(data).splitlines()
    return next(x.split() for x in lines if x.startswith("1 ") and "mixed" in x), lines


def test_the_table_shows_each_routes_plain_decode_beside_measures() -> None:
    """The per-route split on the plain server and measure's plain level, the error the
    sidecar's one plain step per batch cannot see (run 19, c = 16)."""
    route = _route(batch=15.6, best_draft_length=[None])
    voice = {"rate": 92.2, "gaps": 1.1, "line": 90.0}
    agent = {"rate": 81.8, "gaps": 1.9, "line": 84.0}
    routes = {"voice_chat": {**route, "plain": voice}, "coding_agent": {**route, "plain": agent}}
    data = {"levels": [{"concurrency": 16, "routes": routes}], "alone": [],
            "measure": {"curve": [{"running": 1.0, "plain_seconds": 0.0047},
                                  {"running": 15.73, "plain_seconds": 0.011324}]}}  # fmt: skip
    assert (
        table.report(data).splitlines()[-1]
        == "Speedups: 4 of 4 within 10 % of the truth, 4 within 5 %; worst 0.0%"
    )
    untold = {**route, "truth": None, "pair": None}
    lost = {"levels": [{"concurrency": 1, "routes": {"voice_chat": untold}}], "alone": []}
    assert table.report(lost).splitlines()[-1] == (
        "Speedups: none judged (no level has a truth: no two rounds agreed)"
    )
    line = next(x for x in table.report(data).splitlines() if "plain decode" in x)
    assert line == (
        "  c=16 plain decode per request, tok/s: voice_chat 92.2, coding_agent 81.8"
        " (voice_chat +12.7% over coding_agent); measure's plain step 88.3"
    )
    gaps = table.report(data).splitlines()
    assert gaps[gaps.index(line) + 1] == (
        "    other clients out of the batch: voice_chat 1.10, coding_agent 1.90;"
        " their line predicts +7.1%"
    )


def test_a_sweep_pools_its_two_rounds_per_k_over_k0() -> None:
    def rate(tokens: float) -> Rate:
        r = Rate()
        r.add(tokens, 1.0)
        return r

    up = {0: rate(100), 1: rate(110), 2: rate(130)}
    down = {0: rate(80), 1: rate(100), 2: rate(100)}  # the engine slower in the second round
    found = sweep.entry(16, "coding_agent", "mixed", [up, down])
    assert found["rounds"] == [{0: 1.0, 1: 1.1, 2: 1.3}, {0: 1.0, 1: 1.25, 2: 1.25}]
    assert found["speedup"] == {0: 1.0, 1: pytest.approx(210 / 180), 2: pytest.approx(230 / 180)}
    assert found["best"] == 2 and found["lead"] == pytest.approx(230 / 210 - 1)
    assert (found["concurrency"], found["route"], found["mix"]) == (16, "coding_agent", "mixed")


@pytest.mark.parametrize(
    ("said", "expected"),
    [
        ([2, 2], "met"),
        ([(2, 1)], "met: tie"),  # both within 5 % of the true best: 1.20 / 1.17
        ([(1, 3)], "missed (1 of 1)"),  # its top two hold k = 3, 12.5 % under the best
        ([(2,)], "missed (1 of 1)"),  # a tie needs two
        ([1, 2], "met / within error"),  # k = 1 is 2.6 % under the best
        ([3], "missed (1 of 1)"),
        ([2, 0], "missed (1 of 2)"),
        ([], "-"),
    ],
)
def test_the_sidecars_best_k_is_judged_against_the_truth(
    said: list[sweep.Said], expected: str
) -> None:
    speedup = {0: 1.0, 1: 1.17, 2: 1.20, 3: 1.05}
    assert sweep.judged(speedup, said) == expected


def test_the_count_of_best_ks_met_keeps_a_near_k_apart() -> None:
    """The issue asks for the true best k, or a tie the truth bears out: a named k within 5 %
    of the best is reported beside the count, not in it."""
    route = _route()
    sweep_row = {"concurrency": 1, "mix": "mixed", "speedup": {0: 1.0, 1: 1.17, 2: 1.20},
                 "best": 2, "lead": 0.026}  # fmt: skip
    data = {
        "levels": [
            {
                "concurrency": 1,
                "routes": {
                    "voice_chat": {**route, "best_draft_length": [2, 2]},
                    "coding_agent": {**route, "best_draft_length": [1, 2]},
                },
            }
        ],
        "alone": [],
        "sweep": [{**sweep_row, "route": "voice_chat"}, {**sweep_row, "route": "coding_agent"}],
    }
    assert table.report(data).splitlines()[-2:] == [
        "Best draft length: 1 of 2 met (mixed sweep); 1 named a k within 5 % of the best",
        # the agent's reading of 1: 1.17 where 2 gives 1.20
        "Best draft length, worst regret (1 - true at the k named / true best): sidecar 2.5%",
    ]


def test_advise_is_judged_with_the_sidecars_readings() -> None:
    """The issue holds advise's best k to the truth too: its "tie" by its own top two."""
    route = _route(best_draft_length=[2, 2])
    advice = {"routes": [{"route": "voice_chat", "best_draft_length": None,
                          "by_draft_length": {"1": [1.0, 0.1], "2": [1.21, 0.1],
                                              "3": [1.2, 0.1]}}]}  # fmt: skip
    data = _one_mixed_level(route, {0: 1.0, 1: 1.17, 2: 1.20, 3: 1.05}, advice)
    row, _ = _mixed_row(data)
    # the sidecar named 2 twice (met); advise called 2 and 3 a tie, and 3 is 12.5 % under
    # (its tie is charged the worse k: 3, 1 - 1.05 / 1.20)
    assert row[-8:] == ["2/2", "tie(2,3)", "missed", "(1", "of", "3)", "0.0%", "12.5%"]
    advice["routes"][0]["by_draft_length"]["3"] = [0.9, 0.1]  # now its top two are 2 and 1
    row, lines = _mixed_row(data)
    assert row[-8:] == ["2/2", "tie(2,1)", "met", "/", "met:", "tie", "0.0%", "2.5%"]
    assert lines[-2] == "Best draft length: 1 of 1 met (mixed sweep)"


def test_a_tie_is_missed_where_the_truth_leads_by_more_than_5_percent() -> None:
    assert sweep.judged({0: 1.0, 1: 0.83, 2: 0.70}, [(0, 1), 0]) == "missed (1 of 2)"


def test_the_table_judges_a_tie_by_the_sidecars_own_top_two() -> None:
    """A reading of no best k is judged on the two k's its options rank first, not on the
    truth's top two alone: here the truth's top two (1, 2) are within 5 %, but the sidecar's
    top two are 2 and 3, and k = 3 is 17 % under the best."""
    route = _route(
        best_draft_length=[None, 2],
        readings=[{"by_draft_length": {"1": 1.1, "2": 1.3, "3": 1.28}}, {}],
    )
    row, lines = _mixed_row(_one_mixed_level(route, {0: 1.0, 1: 1.20, 2: 1.18, 3: 1.0}))
    # the tie charged its worse k, 3: 1 - 1.0 / 1.2
    assert row[-8:] == ["tie(2,3)/2", "-", "missed", "(1", "of", "2)", "16.7%", "-"]
    assert lines[-2] == "Best draft length: 0 of 1 met (mixed sweep)"


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--steps", "ab,nope"], "--steps takes build,models,ab,repeat,sweep"),
        (["--sweep-mix", "mixed,both"], "--sweep-mix takes mixed,alone, got 'mixed,both'"),
        (["--length-spread", "-1"], "--length-spread takes 0..2, got -1.0"),
        (["--levels", "32", "--steps", "repeat"], "--levels takes two levels or more"),
        (["--sweep-levels", "1,x"], "--sweep-levels takes N,N,..., got '1,x'"),
    ],
)
def test_the_harness_refuses_an_unknown_step_or_mix(
    tmp_path: Path, flags: list[str], said: str
) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "bench/gpu_payoff.py", *flags, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=60,
    )
    assert out.returncode == 2
    assert said in out.stderr and len(out.stderr.splitlines()) == 1


def test_step_cost_takes_the_same_length_flag_and_refuses_a_bad_one() -> None:
    """The step-cost reading sends the bench's routes at the A/B's spread (run 18 was at one
    length per route), and refuses a bad spread before it builds or starts anything."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "bench.gpu.step_cost", "--server", "/nonexistent",
         "--length-spread", "3"],
        capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2], timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr == "step_cost: --length-spread takes 0..2, got 3.0\n"


GPU = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "gpu"
CASES = {  # the promtool tests generated from phases recorded on the H200 (BENCHMARKS §11)
    "gpu_costly_at_load_c32.yml": (
        "mixed-c32-r1",
        ["voice_chat", "coding_agent"],
        [],
        "§11, c = 32, round 1",
    ),
    "gpu_costly_at_load_c1.yml": (
        "mixed-c1-r1",
        [],
        ["voice_chat", "coding_agent"],
        "§11, c = 1, round 1",
    ),
    # one load, one route costing and one paying: voice x0.73, the agent x1.21 (run 17)
    "gpu_costly_at_load_c16.yml": (
        "run17-mixed-c16-r2",
        ["voice_chat"],
        ["coding_agent"],
        "§11 run 17, c = 16, round 2",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_gpu_promtool_tests_are_what_the_recorded_pages_give(name: str) -> None:
    """deploy/prometheus/tests/gpu_costly_at_load_*.yml regenerate from the recorded pages
    (promtool runs them: tests/integration/test_prometheus_rules.py)."""
    from bench.gpu import promtool_case

    pages, fires, quiet, source = CASES[name]
    made = promtool_case.test_document(
        (GPU / f"{pages}-before.prom").read_text(encoding="utf-8"),
        (GPU / f"{pages}-after.prom").read_text(encoding="utf-8"),
        8,
        fires,
        quiet,
        f"docs/BENCHMARKS.md {source}",
        promtool_case.load_curve(GPU / "curve.json"),
    )
    shipped = GPU.parents[2] / "deploy" / "prometheus" / "tests" / name
    assert made == shipped.read_text(encoding="utf-8")


def test_a_server_command_is_plain_or_drafting_and_shares_kv_when_asked() -> None:
    models = Models(Path("/m/t.gguf"), Path("/m/d.gguf"))
    plain = command(Path("/b/llama-server"), models, 8080, Launch(), None)
    assert "-md" not in plain and "--kv-unified" not in plain and "-ngl" in plain
    spec = command(Path("/b/llama-server"), models, 8081, Launch(kv_unified="all"), 3,
                   (0.9, 0.8, 0.7, 0.6))  # fmt: skip
    assert spec[spec.index("--spec-draft-n-max") + 1] == "3"
    assert spec[spec.index("--spec-synth-rates") + 1] == "0.9,0.8,0.7"
    assert "--kv-unified" in spec
    only_plain = Launch(kv_unified="plain")
    assert "--kv-unified" in command(Path("/b/llama-server"), models, 8080, only_plain, None)
    assert "--kv-unified" not in command(Path("/b/llama-server"), models, 8081, only_plain, 3)


def test_every_script_launches_its_servers_from_the_same_flags() -> None:
    """gpu_payoff and step_cost take one set of launch flags: a step-cost run is comparable to
    the A/B only if its servers were started alike."""
    import argparse

    ap = argparse.ArgumentParser()
    Launch.add_flags(ap)
    assert Launch.from_flags(ap.parse_args([])) == Launch()
    args = ap.parse_args(
        ["--parallel", "8", "--ctx", "4096", "--kv-unified", "--flash-attn", "off"]
    )
    assert Launch.from_flags(args, gpu=False) == Launch(8, 4096, False, "all", "off")
    assert Launch.from_flags(ap.parse_args(["--kv-unified", "plain"])).kv_unified == "plain"


def test_a_streams_decode_is_the_servers_token_count_not_its_events() -> None:
    from bench.gpu.rounds import Rate
    from bench.gpu.traffic import _Stream

    seen = _Stream()
    for n in (1, 2, 5, 9):  # tokens 3-4 and 6-8 sent no event (inside a character, held back)
        seen.content({"choices": [{"delta": {"content": "x"}}], "timings": {"predicted_n": n}})
    assert seen.events == 4 and seen.decoded == 8
    bare = _Stream()
    for _ in range(4):
        bare.content({"choices": [{"delta": {"content": "x"}}]})
    assert bare.decoded == 3  # without timings: one token an event
    rate = Rate()
    seen.count_into(rate, finished=True)
    assert rate.tokens == 8


def test_a_phases_step_cost_is_wall_per_decode_call_from_the_servers_counters() -> None:
    from bench.gpu.step_cost import step_row

    before = {"llamacpp:n_decode_total": 100.0, "llamacpp:spec_decode_num_drafts_total": 50.0,
              "llamacpp:spec_decode_num_draft_tokens_total": 150.0}  # fmt: skip
    after = {"llamacpp:n_decode_total": 400.0, "llamacpp:spec_decode_num_drafts_total": 350.0,
             "llamacpp:spec_decode_num_draft_tokens_total": 1050.0}  # fmt: skip
    assert step_row(before, after, 6.0) == {"ms_per_decode": 20.0, "drafted_per_draft": 3.0}
    plain = {"llamacpp:n_decode_total": 10.0}
    assert step_row({}, plain, 0.5) == {"ms_per_decode": 50.0, "drafted_per_draft": None}


def test_step_cost_reads_the_servers_counters_over_http() -> None:
    """Only `llamacpp:` samples, by name, through the sidecar's scanner: HELP/TYPE lines and
    other families are not counters of the step."""
    import http.server
    import threading

    from bench.gpu.step_cost import counters

    page = (b"# HELP llamacpp:n_decode_total calls\n# TYPE llamacpp:n_decode_total counter\n"
            b"llamacpp:n_decode_total 12\nllamacpp:spec_decode_num_drafts_total 3\n"
            b"process_cpu_seconds_total 9\n")  # fmt: skip

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        found = counters(f"http://127.0.0.1:{server.server_port}/metrics")
    finally:
        server.shutdown()
    assert found == {"llamacpp:n_decode_total": 12.0, "llamacpp:spec_decode_num_drafts_total": 3.0}


def test_the_sweep_row_carries_the_step_its_truth_implies_beside_measures() -> None:
    """Run 21, voice at c = 1: E(k) over the true speedup gives the step in plain steps (1.76,
    1.88, 2.02, ...), printed under the row with measure's steps at that level (run 21: 1, 2, 3
    drafts at 8.67 / 9.12 / 9.04 ms, plain 4.8), so a best-k miss shows which model missed."""
    rates = (0.60, 0.30, 0.18, 0.10, 0.06)
    speedup = {0: 1.0, 1: 0.91, 2: 1.01, 3: 1.03, 4: 1.07, 5: 1.01}
    steps = sweep.implied_steps(speedup, rates)
    assert steps[0] == 1.0 and steps[1] == pytest.approx(1.6 / 0.91)
    assert steps[5] == pytest.approx(2.24 / 1.01)
    assert sweep.implied_steps({0: 1.0, 6: 1.0, 2: None}, rates) == {0: 1.0, 6: None, 2: None}

    def rate(tokens: float) -> Rate:
        r = Rate()
        r.add(tokens, 1.0)
        return r

    rounds = [{k: rate(100 * x) for k, x in speedup.items()}] * 2
    found = sweep.entry(1, "voice_chat", "mixed", rounds, rates)
    assert found["steps"] == pytest.approx(steps)
    data = {"args": {"k": "3"}, "levels": [], "alone": [], "sweep": [found],
            "measure": {"curve": [{"running": 1.0, "plain_seconds": 0.0048,
                                   "verify_seconds": 0.00904,
                                   "draft_seconds": {"1": 0.00867, "2": 0.00912}}]}}  # fmt: skip
    lines = table.report(json.loads(json.dumps(data))).splitlines()
    true_row = next(x.split() for x in lines if x.lstrip().startswith("step, true"))
    assert true_row == ["step,", "true", "1.000", "1.758", "1.881", "2.019", "2.037", "2.218"]
    measure_row = next(x.split() for x in lines if x.lstrip().startswith("step, measure"))
    assert measure_row == ["step,", "measure", "1.000", "1.806", "1.900", "1.883", "-", "-"]
