"""`specdec derive BEFORE AFTER [--json]`, run as a user runs it (python -m exporter)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.scrape.derive import delta, report, to_table
from exporter.scrape.families import families

from .pages import MODEL, SGLANG_PAGE, bump, four_engines, one_engine, set_counts, shift_created

SERIES_KEYS = {
    "model_name",
    "engine",
    "drafts",
    "draft_tokens",
    "accepted_tokens",
    "acceptance_rate",
    "mean_acceptance_length",
    "per_position",
}


def derive(tmp_path: Path, before: str, after: str, *flags: str) -> subprocess.CompletedProcess:
    (tmp_path / "before.prom").write_text(before, encoding="utf-8")
    (tmp_path / "after.prom").write_text(after, encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "exporter", "derive", "before.prom", "after.prom", *flags],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


def derive_json(tmp_path: Path, before: str, after: str, *flags: str) -> dict:
    proc = derive(tmp_path, before, after, "--json", *flags)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_json_one_engine_exact(tmp_path):
    after = bump(one_engine(), 1000, 3000, 1500, (700, 500, 300))
    doc = derive_json(tmp_path, one_engine(), after)
    figures = {
        "drafts": 1000.0,
        "draft_tokens": 3000.0,
        "accepted_tokens": 1500.0,
        "acceptance_rate": 0.5,  # 1500 / 3000
        "mean_acceptance_length": 2.5,  # 1 + 1500 / 1000
        "per_position": [0.7, 0.5, 0.3],  # 700, 500, 300 / 1000
    }
    assert doc == {
        "series": [{"model_name": MODEL, "engine": "0", **figures}],
        "total": {"model_name": MODEL, **figures},
    }
    assert set(doc["series"][0]) == SERIES_KEYS
    assert set(doc["total"]) == SERIES_KEYS - {"engine"}


def test_json_four_engines_total_sums_the_engines(tmp_path):
    after = four_engines()
    steps = {
        "0": (100, (60, 30, 10, 0, 0)),
        "1": (200, (90, 60, 30, 15, 5)),
        "2": (300, (100, 80, 60, 40, 20)),
        "3": (400, (100, 100, 90, 60, 50)),
    }
    for engine, (accepted, per_pos) in steps.items():
        after = bump(after, 100, 500, accepted, per_pos, [engine])
    doc = derive_json(tmp_path, four_engines(), after)
    assert [(s["engine"], s["accepted_tokens"]) for s in doc["series"]] == [
        ("0", 100.0),
        ("1", 200.0),
        ("2", 300.0),
        ("3", 400.0),
    ]
    engine3 = doc["series"][3]
    assert engine3["acceptance_rate"] == pytest.approx(0.8)  # 400 / 500
    assert engine3["mean_acceptance_length"] == pytest.approx(5.0)  # 1 + 400 / 100
    assert engine3["per_position"] == pytest.approx([1.0, 1.0, 0.9, 0.6, 0.5])
    total = doc["total"]
    assert (total["drafts"], total["draft_tokens"], total["accepted_tokens"]) == (
        400.0,
        2000.0,
        1000.0,
    )
    assert total["model_name"] == MODEL
    assert total["acceptance_rate"] == pytest.approx(0.5)
    assert total["mean_acceptance_length"] == pytest.approx(3.5)  # 1 + 1000 / 400
    # positions summed over engines: 350, 270, 190, 115, 75 of 400 drafts
    assert total["per_position"] == pytest.approx([0.875, 0.675, 0.475, 0.2875, 0.1875])


def test_identical_pages_give_null_rates(tmp_path):
    proc = derive(tmp_path, one_engine(), one_engine(), "--json")
    assert proc.returncode == 0
    doc = json.loads(proc.stdout)
    zero = {
        "drafts": 0.0,
        "draft_tokens": 0.0,
        "accepted_tokens": 0.0,
        "acceptance_rate": None,
        "mean_acceptance_length": None,
        "per_position": [None, None, None],  # k positions, null: no drafts to divide by
    }
    assert doc == {
        "series": [{"model_name": MODEL, "engine": "0", **zero}],
        "total": {"model_name": MODEL, **zero},
    }
    assert '"acceptance_rate": null' in proc.stdout
    assert "NaN" not in proc.stdout


def test_reset_between_the_files_counts_the_after_value(tmp_path):
    # the engine restarted: lower counters, a new _created
    after = shift_created(set_counts(one_engine(), 500, 1500, 600, (300, 200, 100)), 600.0)
    doc = derive_json(tmp_path, one_engine(), after)
    [series] = doc["series"]
    assert (series["drafts"], series["draft_tokens"], series["accepted_tokens"]) == (
        500.0,
        1500.0,
        600.0,
    )
    assert series["acceptance_rate"] == pytest.approx(0.4)
    assert series["mean_acceptance_length"] == pytest.approx(2.2)
    assert series["per_position"] == pytest.approx([0.6, 0.4, 0.2])


def test_changed_created_is_a_reset_too(tmp_path):
    # counters higher than before, but a new start time: everything after counted from zero
    after = shift_created(bump(one_engine(), 10, 30, 15, (7, 5, 3)), 600.0)
    [series] = derive_json(tmp_path, one_engine(), after)["series"]
    assert series["drafts"] == 1.2e6 + 10


NOISE = f"""\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# vllm:spec_decode_num_drafts_total{{engine="0",model_name="{MODEL}"}} 1e12
sglang:spec_accept_rate{{model_name="{MODEL}"}} 0.9
sglang:spec_verify_calls_total{{model_name="{MODEL}"}} 12345
vllm:spec_decode_draft_acceptance_rate{{engine="0",model_name="{MODEL}"}} 0.5
vllm:spec_decode_num_emitted_tokens_total{{engine="0",model_name="{MODEL}"}} 99999
kserve_vllm:spec_decode_num_drafts_total{{engine="0",model_name="{MODEL}"}} 1e9
trtllm_spec_decode_num_draft_tokens_total{{engine="0",model_name="{MODEL}"}} 1e9
"""


def test_other_lines_created_and_comments_are_ignored(tmp_path):
    before = NOISE + one_engine()
    after = bump(one_engine(), 1000, 3000, 1500, (700, 500, 300)) + NOISE.replace("1e", "7e")
    doc = derive_json(tmp_path, before, after)
    assert len(doc["series"]) == 1
    assert doc["total"]["drafts"] == 1000.0
    assert doc["total"]["acceptance_rate"] == 0.5


def test_relabelled_prefix_and_trtllm(tmp_path):
    kserve = one_engine().replace("vllm:", "kserve_vllm:")
    after = bump(one_engine(), 1000, 3000, 1500, (700, 500, 300)).replace("vllm:", "kserve_vllm:")
    doc = derive_json(tmp_path, kserve, after, "--prefix", "kserve_vllm:")
    assert doc["total"]["accepted_tokens"] == 1500.0

    trt = 'trtllm_spec_decode_num_draft_tokens_total{{engine="0",model_name="t"}} {}\n' + (
        'trtllm_spec_decode_num_accepted_tokens_total{{engine="0",model_name="t"}} {}\n'
    )
    doc = derive_json(tmp_path, trt.format(100, 50), trt.format(400, 200), "--engine", "trtllm")
    assert doc["series"] == [
        {
            "model_name": "t",
            "engine": "0",
            "drafts": None,
            "draft_tokens": 300.0,
            "accepted_tokens": 150.0,
            "acceptance_rate": 0.5,
            "mean_acceptance_length": None,
            "per_position": None,
        }
    ]


def test_table_output_holds_the_numbers(tmp_path):
    after = bump(one_engine(), 1000, 3000, 1500, (700, 500, 300))
    proc = derive(tmp_path, one_engine(), after)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == [
        "model_name",
        "engine",
        "drafts",
        "draft_tokens",
        "accepted",
        "acceptance",
        "tokens/step",
        "per",
        "position",
    ]
    assert lines[1].split() == [
        MODEL,
        "0",
        "1000",
        "3000",
        "1500",
        "50.0%",
        "2.50",
        "70.0%",
        "50.0%",
        "30.0%",
    ]
    assert lines[2].split()[0] == "TOTAL"
    assert lines[2].split()[1:] == [
        "1000",
        "3000",
        "1500",
        "50.0%",
        "2.50",
        "70.0%",
        "50.0%",
        "30.0%",
    ]


def test_table_with_no_traffic_shows_dashes(tmp_path):
    proc = derive(tmp_path, one_engine(), one_engine())
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[1].split() == [MODEL, "0", "0", "0", "0", "-", "-", "-"]


def test_missing_file_exits_2(tmp_path):
    (tmp_path / "before.prom").write_text(one_engine(), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "derive", "before.prom", "gone.prom", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "gone.prom" in proc.stderr
    assert proc.stdout == ""


def test_total_of_several_models_has_no_model_name():
    other = one_engine().replace(MODEL, "other-model")
    before = one_engine() + other
    after = bump(one_engine(), 10, 30, 15, (7, 5, 3)) + bump(other, 20, 60, 30, (14, 10, 6))
    doc = report(delta(before, after, families("vllm")).series)
    assert [s["model_name"] for s in doc["series"]] == [MODEL, "other-model"]
    assert doc["total"]["model_name"] is None
    assert doc["total"]["drafts"] == 30.0
    assert doc["total"]["acceptance_rate"] == pytest.approx(45 / 90)
    assert to_table(doc).splitlines()[-1].split()[:4] == ["TOTAL", "30", "90", "45"]


@pytest.mark.parametrize(
    "page",
    [
        "# README\n\nNot a metrics page at all.\n",
        "\x00\x13\xfe garbage \x7f" * 20,
        "# HELP specdec_drafts_total Speculative verify steps.\n"
        "# TYPE specdec_drafts_total counter\n"
        'specdec_drafts_total{target="sim",model_name="m",engine="0"} 12.0\n',
    ],
    ids=["readme", "random-bytes", "the-sidecars-own-page"],
)
def test_a_page_without_spec_decode_counters_exits_1_naming_it(tmp_path, page):
    proc = derive(tmp_path, one_engine(), page)
    assert proc.returncode == 1, proc.stderr
    assert "after.prom has no speculative-decoding counters" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    proc = derive(tmp_path, page, one_engine())  # BEFORE: taken as zero, with a warning
    assert proc.returncode == 0 and "BEFORE (before.prom) has no counters" in proc.stderr


def test_swapped_files_are_refused_and_the_right_order_is_calm(tmp_path):
    later = bump(one_engine(), 1000, 3000, 2000, (900, 700, 400))
    proc = derive(tmp_path, later, one_engine(), "--json")
    assert proc.returncode == 1 and "swapped" in proc.stderr and proc.stdout == ""
    calm = derive(tmp_path, one_engine(), later, "--json")
    assert calm.returncode == 0 and calm.stderr == ""


def test_an_sglang_delta_has_steps_and_tokens_per_step_and_no_token_counts() -> None:
    """SGLang's page counts verify calls and generated tokens only: its draft and accepted
    tokens are unknown (null), not zero; tokens per step are its own generated / steps."""
    before = SGLANG_PAGE.format(streamed=700, whole=300, verify=400)
    after = SGLANG_PAGE.format(streamed=1700, whole=800, verify=1000)
    doc = report(delta(before, after, families("sglang")).series)
    assert doc["total"] | {"model_name": None} == {
        "model_name": None,
        "drafts": 600.0,
        "draft_tokens": None,
        "accepted_tokens": None,
        "acceptance_rate": None,
        "mean_acceptance_length": 2.5,
        "per_position": None,
    }


def test_lower_counters_without_created_stamps_are_a_restart_with_a_warning(tmp_path):
    """With --api-server-count > 1 vLLM shows no _created: a decrease is all there is to go by."""
    plain = "\n".join(line for line in one_engine().splitlines() if "_created" not in line)
    after = set_counts(plain, 500, 1500, 600, (300, 200, 100))
    proc = derive(tmp_path, plain, after, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["total"]["drafts"] == 500.0
    assert "treated as an engine restart" in proc.stderr


def test_lower_counters_with_the_same_created_are_swapped_files(tmp_path):
    after = bump(one_engine(), 1000, 3000, 1500, (700, 500, 300))
    proc = derive(tmp_path, after, one_engine())  # given the wrong way round
    assert proc.returncode == 1
    assert proc.stdout == ""  # no table
    [line] = proc.stderr.splitlines()
    assert "before.prom" in line and "after.prom" in line and "swapped" in line


def test_a_before_page_without_counters_is_taken_as_zero(tmp_path):
    """The engine started (or turned speculation on) between the two pages: AFTER's figures."""
    before = '# a vLLM page without speculation\nvllm:num_requests_running{model_name="m"} 0\n'
    proc = derive(tmp_path, before, one_engine(), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["total"]["drafts"] == 1.2e6 and doc["total"]["accepted_tokens"] == 2.04e6
    assert doc["total"]["acceptance_rate"] == pytest.approx(2.04e6 / 3.6e6)
    [line] = proc.stderr.splitlines()
    assert "BEFORE (before.prom) has no counters: taken as zero" in line


def test_an_after_page_without_counters_is_an_error(tmp_path):
    proc = derive(tmp_path, one_engine(), "vllm:num_requests_running 0\n")
    assert proc.returncode == 1 and proc.stdout == ""
    assert "after.prom has no speculative-decoding counters" in proc.stderr
