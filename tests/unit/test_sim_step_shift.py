"""`specdec sim --step-shift`: a plain or verify step that moves by a set fraction from one start
(or one time) to the next, as a GPU's does (the speculative server's step moved 3-11 % between
starts on the GPU bench while its plain step held), so tests can put measure and the live
traffic on either side of a shift."""

from __future__ import annotations

import pytest

from exporter.sim.decoder import SimEngine
from exporter.sim.steptime import MODEL, StepShift


@pytest.mark.parametrize(
    ("text", "shift"),
    [
        ("spec=+0.10", StepShift("spec", 0.10)),
        ("plain=-0.1", StepShift("plain", -0.1)),
        ("spec=0.05@restart", StepShift("spec", 0.05)),
        ("plain=+0.2@90s", StepShift("plain", 0.2, 90.0)),
    ],
)
def test_a_shift_reads_side_fraction_and_when(text: str, shift: StepShift) -> None:
    assert StepShift.parse(text) == shift


@pytest.mark.parametrize("text", ["verify=0.1", "spec", "spec=x", "spec=0.1@soon", "plain=-1"])
def test_a_bad_shift_says_what_it_wants(text: str) -> None:
    with pytest.raises(ValueError, match=r"wants|fraction|duration"):
        StepShift.parse(text)


def test_a_shift_holds_from_the_first_restart_on_for_its_side_only() -> None:
    engine = SimEngine("m", shifts=(StepShift("spec", 0.10),))
    assert engine.shift(True) == engine.shift(False) == 1.0
    engine.restart()
    assert engine.shift(True) == pytest.approx(1.10)
    assert engine.shift(False) == 1.0
    engine.restart()  # once: from one start to the next, not compounding
    assert engine.shift(True) == pytest.approx(1.10)


def test_a_timed_shift_holds_from_its_time_on() -> None:
    shift = StepShift("plain", -0.05, 60.0)
    assert shift.factor(False, 0, 59.0) == 1.0
    assert shift.factor(False, 0, 60.0) == pytest.approx(0.95)
    assert shift.factor(True, 0, 600.0) == 1.0


def test_the_steps_and_the_truths_counterfactual_take_it() -> None:
    """A verify step takes the spec shift, the plain counterfactual in the truth the plain one:
    the simulator's own account of the speedup moves with a spec-only shift."""
    engine = SimEngine("m", shifts=(StepShift("spec", 0.10), StepShift("plain", -0.20)))
    engine.restart()
    engine.running[0] = 8
    seconds = engine._timed("ja_chat", "0", 3, 3)
    assert seconds == pytest.approx(MODEL.verify(8, 3) * 1.10)
    assert engine.payoff["ja_chat"].plain_seconds == pytest.approx(MODEL.plain(8) * 0.80)
    assert engine._timed("ja_chat", "0", 1, 0) == pytest.approx(MODEL.plain(8) * 0.80)
