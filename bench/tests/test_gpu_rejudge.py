"""`python -m bench.gpu.rejudge OUT`: a run's best-k readings recomputed from its recorded pages
with this checkout's options model, judged against the run's own sweep."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from bench.gpu import product, rejudge

# run 23, voice at c = 16, one mixed round's window (docs/BENCHMARKS.md §11), and the sweep
WINDOW = """\
specdec_route_drafts_total{route="voice_chat",source="estimated"} 1664.6
specdec_route_draft_tokens_total{route="voice_chat",source="exact"} 4286
specdec_route_draft_tokens_total{route="voice_chat",source="estimated"} 656.77
specdec_route_accepted_tokens_total{route="voice_chat",source="exact"} 1573
specdec_route_accepted_tokens_total{route="voice_chat",source="estimated"} 402
specdec_route_decode_tokens_total{route="voice_chat",source="exact"} 3047
specdec_route_decode_seconds_total{route="voice_chat",source="exact"} 51.52
specdec_route_decode_steps_total{route="voice_chat",source="exact"} 1474
specdec_route_spec_requests_total{route="voice_chat"} 120
specdec_route_request_draft_tokens_squared_total{route="voice_chat"} 153080.3
specdec_route_request_draft_tokens_cubed_total{route="voice_chat"} 5467895
specdec_route_request_accepted_tokens_squared_total{route="voice_chat"} 22539.2
specdec_route_request_accepted_times_draft_tokens_total{route="voice_chat"} 56185.6
specdec_engine_running_request_seconds_total 100
specdec_engine_running_request_batch_seconds_total 1553
"""
RESULTS = {
    "args": {"k": 3},
    "measure": {
        "curve": [
            {"running": 4.0, "plain_seconds": 0.007908, "verify_seconds": 0.014862,
             "draft_seconds": {"1": 0.010833, "2": 0.013075}},
            {"running": 15.88, "plain_seconds": 0.014265, "verify_seconds": 0.040202,
             "draft_seconds": {"1": 0.023770, "2": 0.033406}},
        ]
    },
    "levels": [
        {"concurrency": 16, "routes": {"voice_chat": {"rounds": [0.8, 0.8], "pair": [0, 1]}}}
    ],
    "sweep": [
        {"concurrency": 16, "route": "voice_chat", "mix": "mixed",
         "speedup": {"0": 1.0, "1": 0.935, "2": 0.853, "3": 0.791, "4": 0.733, "5": 0.666}},
    ],
}  # fmt: skip


def _run(tmp_path: Path, packed: bool) -> Path:
    out = tmp_path / "run"
    pages = out / "pages"
    pages.mkdir(parents=True)
    (out / "results.json").write_text(json.dumps(RESULTS), encoding="utf-8")
    for n in (1, 2):
        (pages / f"mixed-c16-r{n}-before.prom").write_text("", encoding="utf-8")
        (pages / f"mixed-c16-r{n}-after.prom").write_text(WINDOW, encoding="utf-8")
    if packed:  # as gpu_payoff.py's users bring a run back: pages.tgz, no pages/
        with tarfile.open(out / "pages.tgz", "w:gz") as tar:
            tar.add(pages, arcname="pages")
        for page in pages.iterdir():
            page.unlink()
        pages.rmdir()
    return out


@pytest.mark.parametrize("packed", [False, True])
def test_a_recorded_window_is_read_again_with_this_checkouts_model(
    tmp_path: Path, packed: bool
) -> None:
    """Run 23's voice window at c = 16, read with the cost ratio at its load (its steps drafted
    4286 tokens in 1474 steps): the speedup recomputed beside the truth and the figure as run,
    its options at k its estimated speedup, and it names 0, the truth's best (x0.935 at 1)."""
    run = _run(tmp_path, packed)
    lines = rejudge.rejudge(run)
    assert lines[0].startswith("Recomputed from the recorded pages")
    steps = rejudge.curve(RESULTS)
    estimated = (3047 / 1474) / (steps.cost(4286 / 1474, 15.53) or 0.0)
    assert lines[2].split()[:3] == ["16", "voice_chat", "-"]  # no truth in this document
    assert f"x{estimated:.3f}" in lines[2]
    start = next(i for i, line in enumerate(lines) if line.startswith("c=16 voice_chat truth"))
    assert lines[start].startswith("c=16 voice_chat truth 1.000 0.935")
    for line in lines[start + 1 : start + 3]:
        words = line.split()
        options = [float(x) for x in words[2:8]]
        # its steps drafted 2.91 a step, the option is a step of 3: within 2 %
        assert options[3] == pytest.approx(estimated, rel=0.02)
        assert max(range(6), key=options.__getitem__) == 0
        assert words[8:12] == ["said", "0", "regret", "0.0%"]  # named, not a tie
    assert lines[start + 3].strip() == "met"
    assert lines[-2:] == [
        "Best draft length: 1 of 1 met (mixed sweep)",
        "Best draft length, worst regret: 0.0%",
    ]


def test_a_folder_without_results_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert rejudge.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(tmp_path) in err


def test_a_round_shows_the_routes_headline_acceptance_beside_its_exact_one() -> None:
    """Run 23's voice at c = 16, round 2: 0.400 on the page (cut requests shared evenly then)
    against its exact requests' 0.367; a page without them says nothing."""
    page = product.parse(
        'specdec_route_acceptance_ratio{model_name="bench",route="voice_chat",window="9s"} 0.3996\n'
        'specdec_route_exact_acceptance_ratio{model_name="bench",route="voice_chat",window="9s"}'
        " 0.3670\n"
    )
    assert rejudge.acceptance(page, "voice_chat") == "  acceptance 0.400 (exact 0.367)"
    assert rejudge.acceptance(page, "coding_agent") == ""
