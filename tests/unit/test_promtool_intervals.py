"""The committed promtool test of the interval rules is what its generator writes: the
expected values stay those of the Python estimator (CI runs promtool on the file)."""

from __future__ import annotations

from pathlib import Path

from tests.promtool_intervals import document

FILE = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "tests" / "intervals.yml"


def test_the_committed_file_is_the_generators_output() -> None:
    assert FILE.read_text() == document(), "run: python -m tests.promtool_intervals > " + str(FILE)
