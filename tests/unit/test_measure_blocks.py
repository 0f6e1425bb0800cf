"""`specdec measure` prints `models:` blocks to paste into the sidecar config: each must load as
printed, whatever was measured (an overhead-bound engine, or noise, can time a verify step no
dearer than a plain one: the config takes a step cost of at least 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.config import load
from exporter.measure.report import _caveats, curve_table


@pytest.mark.parametrize("verify", [0.0093, 0.0059])  # dearer than the plain step, and cheaper
def test_the_curve_block_loads_as_printed(tmp_path: Path, verify: float) -> None:
    levels = [
        {"concurrency": c, "requests": 40, "running": b, "verify_seconds": verify * b ** 0.2,
         "plain_seconds": 0.0061 * b ** 0.3, "tokens_per_step": 2.3, "decode_tokens_per_second":
         250.0, "plain_decode_tokens_per_second": 160.0, "speedup": 1.5}
        for c, b in ((1, 1.0), (4, 3.9))
    ]  # fmt: skip
    block = curve_table(levels, "tiny", 3).split("\n\nmodels:", 1)[1]
    path = tmp_path / "specdec.yaml"
    path.write_text(
        'targets: [{name: vllm, url: "http://127.0.0.1:8000/metrics"}]\nmodels:' + block,
        encoding="utf-8",
    )
    (model,) = load(path).models
    assert model.name == "tiny" and len(model.step_time) == 2
    assert model.step_cost_ratio == max(1.0, round(verify / 0.0061, 2))
    assert ("# measured 0.97" in block) == (verify < 0.0061)


def _row(draft_tokens: float | None, own: float | None) -> dict[str, object]:
    return {"name": "ja_chat", "drafts": 100.0, "draft_tokens": draft_tokens,
            "per_request_draft_tokens": own, "interrupted": False}  # fmt: skip


def test_other_traffic_on_the_engine_is_said() -> None:
    """The engine's /metrics delta past the requests' own draft tokens means other traffic
    shared the engine: measure says so, by scenario; equal (an idle engine) it says nothing."""
    shared = "\n".join(_caveats([_row(1300.0, 1000.0)]))
    assert (
        "ja_chat: the engine drafted 1300 tokens over the scenario, its requests 1000 (+30%)"
        in (shared)
    )
    assert "other traffic shared the engine" in shared
    for quiet in (_row(1000.0, 1000.0), _row(1040.0, 1000.0), _row(1300.0, None), _row(None, 9.0)):
        assert not any("other traffic" in line for line in _caveats([quiet]))
