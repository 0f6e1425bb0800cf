"""`specdec advise`: the advice from a sidecar page, and its clear errors."""

from __future__ import annotations

import http.server
import itertools
import json
import subprocess
import threading
from collections.abc import Callable

from exporter.cli.advise import Page, _ranges, advise, read_prometheus, to_text
from harness.helpers import free_port, specdec
from tests.unit.pages import sidecar_page


def test_the_advice_per_route_and_the_schedule() -> None:
    advice, problem = advise(sidecar_page(), "5m")
    assert problem is None
    (voice,) = advice["routes"]
    assert voice["best_draft_length"] == 1 and voice["speedup_measured"] == 0.81
    assert abs(voice["speculation_off_changes_decode_by"] - 0.25) < 1e-9  # 1 / 0.8 - 1
    schedule = advice["dynamic_speculative_decoding"]["m"]
    assert schedule["acceptance_rate_per_pos"] == [0.75, 0.52, 0.32]
    config = schedule["speculative_config"]
    assert config["num_speculative_tokens"] == 3
    ranges = config["num_speculative_tokens_per_batch_size"]
    assert ranges[0][0] == 1 and ranges[-1][1] == 256  # from batch 1, without gaps
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(ranges))
    ks = [k for _, _, k in ranges]
    assert ks == sorted(ks, reverse=True)  # k falls as the batch grows
    assert ks[0] >= 2 and ks[-1] == 0
    seconds = schedule["step_seconds_by_batch"]
    assert seconds[1][0] == 0.98 / 72 + 0.02 / 72 and seconds[1][3] == 1.67 / 72 + 0.11 / 72


def test_nothing_is_advised_past_the_batch_the_curve_was_measured_at() -> None:
    """A curve measured to 7.98 running requests (concurrency 8): the schedule stops at 8 and
    the text says why, instead of reading a straight line out to 256."""
    advice, problem = advise(sidecar_page(measured_to=7.98), "5m")
    assert problem is None
    schedule = advice["dynamic_speculative_decoding"]["m"]
    assert schedule["measured_up_to_running"] == 8
    ranges = schedule["speculative_config"]["num_speculative_tokens_per_batch_size"]
    assert ranges[0][0] == 1 and ranges[-1][1] == 8
    assert max(schedule["step_seconds_by_batch"]) == 8
    text = to_text(advice)
    assert "running above 8: not advised" in text
    assert not any(f"-{b}: k" in text for b in (15, 63, 255, 256))
    whole = advise(sidecar_page(), "5m")[0]["dynamic_speculative_decoding"]["m"]
    assert whole["speculative_config"]["num_speculative_tokens_per_batch_size"][-1][1] == 256
    unsaid = sidecar_page()
    del unsaid.samples["specdec_model_step_curve_max_running_requests"]
    assert "how far" in advise(unsaid, "5m")[0]["dynamic_speculative_decoding"]["m"]["error"]


def test_advise_says_whether_the_configured_schedule_matches() -> None:
    """Advise, apply, verify: once the advice is in the config's draft_length_schedule (the
    sidecar exports it by range), advise says it matches; a config that differs is named with
    the first batch where it does."""
    p = sidecar_page()
    advised = advise(p, "5m")[0]["dynamic_speculative_decoding"]["m"]
    assert advised["configured"] is None  # nothing configured: nothing to compare
    ranges = advised["speculative_config"]["num_speculative_tokens_per_batch_size"]
    for first, last, k in ranges:
        p.samples["specdec_model_schedule_range_draft_length"].append(
            ({"model_name": "m", "first_batch": str(first), "last_batch": str(last)}, float(k))
        )
    advice = advise(p, "5m")[0]
    mine = advice["dynamic_speculative_decoding"]["m"]["configured"]
    assert mine == {"num_speculative_tokens_per_batch_size": ranges, "matches": True,
                    "first_batch_differing": None}  # fmt: skip
    assert "draft_length_schedule " + json.dumps(ranges) + " already matches this" in to_text(
        advice
    )
    other = sidecar_page()
    other.samples["specdec_model_schedule_range_draft_length"].append(
        ({"model_name": "m", "first_batch": "1", "last_batch": "256"}, 3.0)
    )
    mine = advise(other, "5m")[0]["dynamic_speculative_decoding"]["m"]["configured"]
    assert not mine["matches"]
    assert mine["first_batch_differing"] == next(a for a, _, k in ranges if k != 3)


def test_no_curve_and_no_traffic_are_said() -> None:
    assert "step-time curve" in (advise(sidecar_page(with_curve=False), "5m")[1] or "")
    assert "full 5m window" in (advise(sidecar_page(with_routes=False), "5m")[1] or "")


def test_ranges() -> None:
    assert _ranges({1: 3, 2: 3, 4: 2, 8: 2, 16: 0}) == [[1, 3, 3], [4, 15, 2], [16, 16, 0]]
    assert _ranges({1: 0}) == [[1, 1, 0]]


def test_no_sidecar_is_one_line_and_exit_1() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    out = subprocess.run(specdec("advise", "--sidecar", url), capture_output=True, text=True)
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1 and "cannot read" in out.stderr, out.stderr
    bad = subprocess.run(specdec("advise", "--sidecar", "nohost"), capture_output=True, text=True)
    assert bad.returncode == 2 and "--sidecar" in bad.stderr


def _prometheus_answering(result: list[dict[str, object]]) -> tuple[str, Callable[[], None]]:
    """A stand-in for Prometheus's /api/v1/query with one instant vector (the live stack's test
    reads a real Prometheus; this one checks the choice of instance)."""
    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server.shutdown


def _vector(instance: str) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for name, samples in sidecar_page().samples.items():
        for labels, value in samples:
            metric = {"__name__": name, "instance": instance, "job": "specdec", **labels}
            out.append({"metric": metric, "value": [0, str(value)]})
    return out


def test_from_prometheus_one_sidecar_is_read_and_several_must_be_chosen() -> None:
    one = read_prometheus_page(_vector("a:1"), None)
    assert advise(one, "5m")[0]["routes"][0]["best_draft_length"] == 1
    assert advise(one, "5m")[0] == advise(sidecar_page(), "5m")[0]
    url, stop = _prometheus_answering(_vector("a:1") + _vector("b:2"))
    try:
        both = subprocess.run(specdec("advise", "--prometheus", url), capture_output=True,
                              text=True)  # fmt: skip
        assert both.returncode == 1 and both.stderr.count("\n") == 1, both.stderr
        assert "--instance" in both.stderr and "a:1, b:2" in both.stderr
        chosen = subprocess.run(specdec("advise", "--prometheus", url, "--instance", "b:2",
                                        "--json"), capture_output=True, text=True)  # fmt: skip
        assert chosen.returncode == 0, chosen.stderr
        assert json.loads(chosen.stdout)["routes"][0]["route"] == "voice"
        absent = subprocess.run(specdec("advise", "--prometheus", url, "--instance", "c:3"),
                                capture_output=True, text=True)  # fmt: skip
        assert absent.returncode == 1 and "'c:3'" in absent.stderr
    finally:
        stop()


def read_prometheus_page(result: list[dict[str, object]], instance: str | None) -> Page:
    url, stop = _prometheus_answering(result)
    try:
        return read_prometheus(url, instance)
    finally:
        stop()


def test_instance_without_prometheus_is_a_usage_error() -> None:
    out = subprocess.run(specdec("advise", "--instance", "a:1"), capture_output=True, text=True)
    assert out.returncode == 2 and "--instance goes with --prometheus" in out.stderr
