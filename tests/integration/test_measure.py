"""`specdec measure` against simulators: acceptance equals the realised truth exactly, the
speedup and step cost agree with the timing model, bad input gives clear errors."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.measure.scenarios import builtin
from exporter.sim.steptime import MODEL as STEP_TIME
from harness.helpers import child, free_port, http_get, scenario_pack, specdec, wait_for

SPEED = 1.0  # real time: wake-up latency on a busy machine stays small against a step


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A speculative simulator and a plain one (speculation off) as the baseline."""
    logs = tmp_path_factory.mktemp("sims")
    spec, plain = free_port(), free_port()
    with (
        child(
            specdec("sim", "--listen", f"127.0.0.1:{spec}", "--speed", str(SPEED)),
            logs / "spec.log",
        ),
        child(
            specdec(
                "sim",
                "--listen",
                f"127.0.0.1:{plain}",
                "--speed",
                str(SPEED),
                "--num-speculative-tokens",
                "0",
            ),
            logs / "plain.log",
        ),
    ):
        urls = f"http://127.0.0.1:{spec}", f"http://127.0.0.1:{plain}"
        for url in urls:
            wait_for(lambda u=url: http_get(u + "/v1/models"), what=f"{url} up")
        yield urls


def truth(url: str) -> dict[str, dict[str, float]]:
    return json.loads(http_get(url + "/admin/truth"))


def test_measure_matches_truth_and_timing_model(sims: tuple[str, str], tmp_path: Path) -> None:
    spec, plain = sims
    before = truth(spec)
    args = [
        "measure",
        "--base-url",
        spec,
        "--baseline-url",
        plain,
        "--scenario-file",
        str(scenario_pack(tmp_path, 6)),
        "--bytes-per-token",
        "20e9",
        "--bandwidth",
        "1.7e12",
        "--json",
    ]
    out = subprocess.run(specdec(*args), capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout)
    after = truth(spec)
    assert set(doc) == {"scenarios", "baseline", "roofline"}
    expected_cost = STEP_TIME.verify(1, 3) / STEP_TIME.plain(1)
    for row in doc["scenarios"]:
        name = row["name"]
        accepted = after[name]["accepted"] - before.get(name, {}).get("accepted", 0)
        proposed = after[name]["draft_tokens"] - before.get(name, {}).get("draft_tokens", 0)
        assert (row["accepted_tokens"], row["draft_tokens"]) == (accepted, proposed)  # exactly
        assert row["acceptance_rate"] == row["per_request_acceptance_rate"] == accepted / proposed
        assert row["per_request_draft_tokens"] == row["draft_tokens"]  # an idle engine: its own
        assert row["requests"] == 6 and row["ttft_ms_median"] > 0
    comparison = {c["name"]: c for c in doc["baseline"]["comparison"]}
    for row in doc["scenarios"]:
        c = comparison[row["name"]]
        model_speedup = row["mean_acceptance_length"] / expected_cost
        assert c["speedup"] == pytest.approx(model_speedup, rel=0.10), (row["name"], c)
        assert c["step_cost_ratio"] == pytest.approx(expected_cost, rel=0.10), (row["name"], c)
        assert c["breakeven_acceptance_rate"] == pytest.approx((expected_cost - 1) / 3, rel=0.25)
    assert doc["roofline"]["ceiling_tokens_per_second"] == pytest.approx(85.0)


def test_other_traffic_on_the_engine_is_said(sims: tuple[str, str], tmp_path: Path) -> None:
    """Another client sending straight to the engine while measure runs: the engine drafted
    more than measure's requests did, and the table says so (the idle run above: equal)."""
    spec, _ = sims
    stop = threading.Event()
    body = json.dumps({"messages": [{"role": "user", "content": "def merge(a, b):"}],
                       "max_tokens": 60}).encode()  # fmt: skip

    def other_client() -> None:
        while not stop.is_set():
            request = urllib.request.Request(
                spec + "/v1/chat/completions", body, {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=30) as resp:
                resp.read()

    threads = [threading.Thread(target=other_client, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        args = ["measure", "--base-url", spec, "--scenario-file", str(scenario_pack(tmp_path, 3))]
        out = subprocess.run(specdec(*args), capture_output=True, text=True, timeout=300)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert out.returncode == 0, out.stderr
    said = re.findall(r"^(\w+): the engine drafted \d+ tokens over the scenario", out.stdout, re.M)
    assert set(said) == {"ja_chat", "code_agent"}, out.stdout
    assert "other traffic shared the engine" in out.stdout


def test_table_and_models_block(sims: tuple[str, str], tmp_path: Path) -> None:
    spec, plain = sims
    first = subprocess.run(
        specdec(
            "measure",
            "--base-url",
            plain,
            "--scenario-file",
            str(scenario_pack(tmp_path, 6)),
            "--json",
        ),
        capture_output=True,
        text=True,
        check=True,
    )
    saved = tmp_path / "plain.json"
    saved.write_text(first.stdout)
    out = subprocess.run(
        specdec(
            "measure",
            "--base-url",
            spec,
            "--scenario-file",
            str(scenario_pack(tmp_path, 6)),
            "--baseline-file",
            str(saved),
            "--model",
            "sim-27b",
            "--plot",
            str(tmp_path / "plot.png"),
        ),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "ja_chat" in out and "code_agent" in out and "speedup" in out
    assert "models:" in out and "step_cost_ratio:" in out and "- name: sim-27b" in out
    assert "no speculative-decoding counters" not in out
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plain_out = json.loads(first.stdout)  # the plain server: no spec counters, still TTFT/tok/s
    assert all(
        r["acceptance_rate"] is None and r["decode_tokens_per_second_median"]
        for r in plain_out["scenarios"]
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scenario", "nope"], "unknown scenario 'nope'"),
        (["--scenario-file", "/nonexistent.yaml"], "cannot read"),
        (
            ["--scenario", "ja_chat", "--bandwidth", "1e12"],
            "--bytes-per-token and --bandwidth together",
        ),
    ],
)
def test_bad_arguments_exit_2(args: list[str], message: str) -> None:
    result = subprocess.run(
        specdec("measure", "--base-url", "http://127.0.0.1:9", *args),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_bad_scenario_file_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    good = "- name: ok\n  max_tokens: 10\n  prompts: [hi]\n"
    bad.write_text(good + "- name: broken\n  max_tokens: -3\n  prompts: [x]\n")
    result = subprocess.run(
        specdec("measure", "--base-url", "http://127.0.0.1:9", "--scenario-file", str(bad)),
        capture_output=True,
        text=True,
    )
    assert (
        result.returncode == 2 and f"{bad}:4: max_tokens: expected a whole number" in result.stderr
    )


def test_unreachable_and_http_errors_are_clear(sims: tuple[str, str]) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    result = subprocess.run(
        specdec("measure", "--base-url", dead, "--scenario", "ja_chat"),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1 and f"cannot reach {dead}" in result.stderr
    result = subprocess.run(
        specdec("measure", "--base-url", sims[0], "--scenario", "ja_chat", "--model", "other"),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1 and "HTTP 404" in result.stderr


@pytest.mark.parametrize(
    ("given", "hint"),
    [
        ("127.0.0.1:8000", "did you mean 'http://127.0.0.1:8000'?"),
        ("localhost:8000/v1", "did you mean 'http://localhost:8000/v1'?"),
    ],
)
def test_a_base_url_without_a_scheme_gets_a_hint(given: str, hint: str) -> None:
    result = subprocess.run(
        specdec("measure", "--base-url", given, "--scenario", "ja_chat"),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"specdec measure: --base-url wants http(s)://HOST:PORT, got {given!r}; {hint}"
    ]


def one_scenario(tmp_path: Path, prompts: int, max_tokens: int) -> Path:
    s = builtin("code_agent")
    doc = {"name": "code_agent", "max_tokens": max_tokens, "prompts": list(s.prompts[:prompts])}
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps(doc) + "\n", encoding="utf-8")
    return path


def test_a_base_url_ending_in_v1_is_accepted(sims: tuple[str, str], tmp_path: Path) -> None:
    pack = one_scenario(tmp_path, 2, 24)
    args = ["measure", "--base-url", sims[0] + "/v1/", "--scenario-file", str(pack), "--json"]
    result = subprocess.run(specdec(*args), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)["scenarios"]
    assert row["requests"] == 2 and row["acceptance_rate"] is not None


def finished_requests(url: str) -> float:
    page = http_get(url + "/metrics")
    return sum(float(v) for v in re.findall(r"^vllm:request_success_total{.*} (\S+)$", page, re.M))


def test_an_interrupt_reports_what_was_measured_without_blaming_the_server(
    sims: tuple[str, str], tmp_path: Path
) -> None:
    """Ctrl-C after some requests finished: exit 130, the rows measured so far (acceptance from
    vLLM's per-request objects), and no word about missing counters or --speculative-config."""
    spec = sims[0]
    before = finished_requests(spec)
    pack = one_scenario(tmp_path, 40, 200)
    args = ["measure", "--base-url", spec, "--scenario-file", str(pack)]
    proc = subprocess.Popen(
        specdec(*args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a terminal's Ctrl-C: a test run started in the background (`cmd &` in a script) has
        # SIGINT ignored, its children inherit that, and Python then keeps ignoring it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        wait_for(lambda: finished_requests(spec) >= before + 2, timeout=60, what="2 requests done")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "interrupted; what was measured so far" in err
    assert "interrupted before the engine's counters were read again" in out
    assert "code_agent" in out
    for blame in ("no speculative-decoding counters", "--speculative-config", "Traceback"):
        assert blame not in out + err, (blame, out, err)
