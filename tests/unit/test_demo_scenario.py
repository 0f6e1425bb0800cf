"""`specdec demo --scenario drop`'s change, without running it: the agent's clients sample
(a traffic change the simulator's temperature effect carries), the engine accepts less of the
voice chat's drafts (its requests unchanged), each more than the drop alert's fraction; the
flags as a contract, and the temperature effect in `specdec sim --help`."""

from __future__ import annotations

import pytest

from dashboards.config import DEFAULT
from exporter import demo
from exporter.cli import _parser, main
from exporter.sim.decoder import SimEngine, sampled_share


def test_the_drop_moves_the_agents_traffic_and_the_voice_chats_engine() -> None:
    engine = SimEngine(demo.MODEL)
    before = engine.profiles[demo.VOICE_PROFILE]
    temperatures: dict[str, float] = {}
    line = demo.drop(engine, temperatures)
    assert temperatures == {"coding_agent": demo.DROP_TEMPERATURE}
    after = engine.profiles[demo.VOICE_PROFILE]
    assert after.acceptance == demo.DROP_ACCEPTANCE < before.acceptance
    assert (after.decay, after.concentration) == (before.decay, before.concentration)
    assert "coding_agent" in line and "voice_chat" in line
    # both fall further than SpecDecodeAcceptanceDrop's relative floor, so it fires for both
    fraction = DEFAULT.acceptance_drop.fraction
    assert 1 - sampled_share(demo.DROP_TEMPERATURE) > fraction + 0.05
    assert 1 - after.acceptance / before.acceptance > fraction + 0.05


def test_the_flags_are_a_contract() -> None:
    args = _parser().parse_args(["demo", "--scenario", "drop", "--drop-after", "30"])
    assert (args.scenario, args.drop_after) == ("drop", 30.0)
    defaults = _parser().parse_args(["demo"])
    assert (defaults.scenario, defaults.drop_after) == ("steady", None)
    # with Prometheus (a backfilled quiet day) within minutes; without, after the sidecar's
    # own baseline and window
    assert demo.Options(with_prometheus=True).drop_delay() == demo.DROP_AFTER_BACKFILLED <= 180
    assert demo.Options().drop_delay() == demo.DROP_AFTER
    assert demo.Options(drop_after=30.0).drop_delay() == 30.0
    with pytest.raises(SystemExit):
        _parser().parse_args(["demo", "--scenario", "spike"])


def test_a_negative_drop_after_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--scenario", "drop", "--drop-after", "-1"]) == 2
    assert "--drop-after must be >= 0" in capsys.readouterr().err


def test_the_simulators_help_states_its_temperature_effect(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["sim", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "`temperature` T keeps 1 - 0.4 min(T, 1.5)" in text, text
