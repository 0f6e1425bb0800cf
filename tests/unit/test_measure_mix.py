"""The mix measure replays its scenarios in at each level of its curve: interleaved over the
whole replay, in the shares the scenarios' weights give (a step's seconds depend on the mix's
lengths, not only the batch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporter.measure.curve import level_runs
from exporter.measure.runner import interleaved
from exporter.measure.scenarios import Scenario, ScenarioError, load_file


def test_the_curve_replays_the_scenarios_together_in_their_mix() -> None:
    """A plain step's seconds depend on the mix beyond the batch (prefills of new requests land
    in decode steps): at each level the scenarios' requests are interleaved, not run in turn."""
    voice = Scenario("voice", 8, None, ("a", "b"))
    agent = Scenario("agent", 8, None, ("c",))
    items = [(s.name, i) for s, i in interleaved([voice, agent], [1, 2])]
    assert items == [("voice", 0), ("agent", 0), ("voice", 1), ("agent", 1)]
    # unequal numbers: each spread over the whole replay, not the larger one's extras last
    items = [(s.name, i) for s, i in interleaved([voice, agent], [2, 1])]
    assert items == [("voice", 0), ("voice", 1), ("agent", 0), ("voice", 2), ("voice", 3)]
    assert interleaved([voice], [0]) == []


def test_a_level_shares_its_requests_by_the_scenarios_weights() -> None:
    """Equal weights: each scenario an equal share of 3 x the level, in whole runs of its
    prompts, at least `runs`; a weight of 2.5 sends 2.5 times the requests (the batch a
    closed loop holds is requests x length: the GPU bench's routes, 80 and 200 tokens)."""
    one = Scenario("one", 8, None, ("a", "b"))
    assert level_runs([one, one], 16, 1) == [12, 12]  # 24 requests each
    assert level_runs([one, one], 1, 3) == [3, 3]
    voice = Scenario("voice", 80, None, ("a", "b"), weight=2.5)
    agent = Scenario("agent", 200, None, ("c", "d"))
    assert level_runs([voice, agent], 16, 1) == [18, 7]  # 36 and 14 requests
    items = interleaved([voice, agent], level_runs([voice, agent], 16, 1))
    first_half = [s.name for s, _ in items[: len(items) // 2]]
    assert first_half.count("voice") == 18  # the mix holds from the start


def test_a_scenario_files_weight_defaults_to_one() -> None:
    assert Scenario("s", 8, None, ("x",)).weight == 1.0


@pytest.mark.parametrize("weight", [0, -1, "2", True, 1e7, None])
def test_a_bad_weight_is_named_by_file_and_line(tmp_path: Path, weight: object) -> None:
    path = tmp_path / "mix.jsonl"
    good = {"name": "a", "max_tokens": 8, "prompts": ["x"], "weight": 2.5}
    path.write_text(f"{json.dumps(good)}\n{json.dumps({**good, 'name': 'b', 'weight': weight})}\n")
    with pytest.raises(ScenarioError, match=r"mix\.jsonl:2: weight: expected a number > 0"):
        load_file(path)
    path.write_text(f"{json.dumps(good)}\n")
    assert [s.weight for s in load_file(path)] == [2.5]
