"""A real `specdec serve` process scraping fake vLLM pages that change under it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.core.counts import Counts
from harness.helpers import child, free_port, http_get, need_tool, specdec, wait_for
from harness.pages import samples, value
from tests.fakevllm import MODEL, FakeVllm, serve_fake

STEP = Counts(10, 30, 12, (7, 4, 1))  # acceptance 0.4, tokens per step 2.2


class Sidecar:
    def __init__(self, port: int, log: Path) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.log = log

    def page(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return samples(http_get(self.url))

    def value(self, name: str, **labels: str) -> float | None:
        return value(self.page(), name, **labels)

    def log_events(self) -> list[dict[str, object]]:
        return [
            json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")
        ]


@pytest.fixture
def fakes() -> Iterator[tuple[FakeVllm, FakeVllm, int, int]]:
    a, b = FakeVllm(step=STEP), FakeVllm(step=Counts(10, 30, 27, (9, 9, 9)), engines=("0", "1"))
    pa, pb = free_port(), free_port()
    with serve_fake(a, pa), serve_fake(b, pb):
        yield a, b, pa, pb


@pytest.fixture
def sidecar(fakes: tuple[FakeVllm, FakeVllm, int, int], tmp_path: Path) -> Iterator[Sidecar]:
    _, _, pa, pb = fakes
    port = free_port()
    config = tmp_path / "specdec.yaml"
    config.write_text(
        f"listen: 127.0.0.1:{port}\n"
        "windows: [2s, 5s]\n"  # a window's gauges appear once the sidecar is as old
        "targets:\n"
        f"  - {{name: a, url: 'http://127.0.0.1:{pa}/metrics', interval: 0.1, timeout: 0.5}}\n"
        f"  - {{name: b, url: 'http://127.0.0.1:{pb}/metrics', interval: 0.1, timeout: 0.5}}\n"
        f"  - {{name: gone, url: 'http://127.0.0.1:{free_port()}/metrics', interval: 0.1}}\n"
    )
    log = tmp_path / "sidecar.log"
    with child(specdec("serve", "--config", str(config)), log):
        side = Sidecar(port, log)
        wait_for(
            lambda: side.value("specdec_acceptance_ratio", target="b", engine="all", window="5s"),
            what="the longest window's first gauge",
        )
        yield side


def test_derived_gauges_equal_the_pages_ratios(sidecar: Sidecar) -> None:
    page = sidecar.page()
    for window in ("2s", "5s"):
        assert value(
            page, "specdec_acceptance_ratio", target="a", engine="0", window=window
        ) == pytest.approx(0.4)
        assert value(
            page, "specdec_mean_acceptance_length", target="a", engine="0", window=window
        ) == pytest.approx(2.2)
        for pos, ratio in enumerate((0.7, 0.4, 0.1)):
            got = value(
                page,
                "specdec_position_acceptance_ratio",
                target="a",
                engine="0",
                window=window,
                position=str(pos),
            )
            assert got == pytest.approx(ratio)
        # two engines: each engine and their sum
        for engine in ("0", "1", "all"):
            assert value(
                page, "specdec_acceptance_ratio", target="b", engine=engine, window=window
            ) == pytest.approx(0.9)
    assert value(
        page, "specdec_acceptance_ratio", target="a", engine="all", model_name=MODEL, window="5s"
    ) == pytest.approx(0.4)


def test_counters_follow_the_engine(
    sidecar: Sidecar, fakes: tuple[FakeVllm, FakeVllm, int, int]
) -> None:
    a = fakes[0]
    page = sidecar.page()
    drafts = value(page, "specdec_drafts_total", target="a", engine="0")
    tokens = value(page, "specdec_draft_tokens_total", target="a", engine="0")
    accepted = value(page, "specdec_accepted_tokens_total", target="a", engine="0")
    rejected = value(page, "specdec_rejected_draft_tokens_total", target="a", engine="0")
    assert drafts and tokens and accepted is not None and rejected is not None
    steps = drafts / 10
    assert steps == int(steps) and 1 <= steps <= a.requests
    assert (tokens, accepted, rejected) == (30 * steps, 12 * steps, 18 * steps)
    assert (
        value(
            page, "specdec_accepted_tokens_per_position_total", target="a", engine="0", position="2"
        )
        == steps
    )


def test_restart_keeps_counters_monotonic(
    sidecar: Sidecar, fakes: tuple[FakeVllm, FakeVllm, int, int]
) -> None:
    a = fakes[0]
    before = sidecar.value("specdec_draft_tokens_total", target="a", engine="0")
    assert before
    a.restart()
    wait_for(
        lambda: sidecar.value("specdec_engine_restarts_total", target="a", engine="0") == 1,
        what="restart detected",
    )
    seen = [before]
    for _ in range(10):
        seen.append(sidecar.value("specdec_draft_tokens_total", target="a", engine="0") or 0.0)
        ratio = sidecar.value("specdec_acceptance_ratio", target="a", engine="0", window="5s")
        assert ratio == pytest.approx(0.4), "a restart must not spike or dip the ratio"
    assert seen == sorted(seen) and seen[-1] > before
    restarts = [e for e in sidecar.log_events() if e["event"] == "engine restart detected"]
    assert len(restarts) == 1 and restarts[0]["target"] == "a"


def test_failures_are_counted_and_isolated(
    sidecar: Sidecar, fakes: tuple[FakeVllm, FakeVllm, int, int]
) -> None:
    a, b = fakes[0], fakes[1]
    assert sidecar.value("specdec_target_up", target="gone") == 0
    wait_for(
        lambda: (
            (sidecar.value("specdec_scrape_errors_total", target="gone", reason="connection") or 0)
            >= 3
        )
    )

    a.mode = "http_500"
    wait_for(lambda: sidecar.value("specdec_target_up", target="a") == 0, what="a down on HTTP 500")
    wait_for(
        lambda: (
            (sidecar.value("specdec_scrape_errors_total", target="a", reason="http_status") or 0)
            >= 2
        )
    )
    # the 2s window passes without data: a's derived gauges go away, b's stay
    wait_for(
        lambda: (
            sidecar.value("specdec_acceptance_ratio", target="a", engine="0", window="2s") is None
        ),
        what="stale 2s gauge dropped",
    )
    assert sidecar.value(
        "specdec_acceptance_ratio", target="b", engine="all", window="2s"
    ) == pytest.approx(0.9)
    assert sidecar.value("specdec_target_up", target="b") == 1

    a.mode, a.delay = "slow", 2.0
    wait_for(
        lambda: (
            (sidecar.value("specdec_scrape_errors_total", target="a", reason="timeout") or 0) >= 1
        ),
        what="timeout counted",
    )

    a.mode = "malformed"
    wait_for(lambda: sidecar.value("specdec_target_up", target="a") == 1, what="a back up")
    wait_for(lambda: (sidecar.value("specdec_malformed_lines_total", target="a") or 0) >= 2)
    back = wait_for(
        lambda: sidecar.value("specdec_acceptance_ratio", target="a", engine="0", window="5s"),
        what="a's 5s gauge back",
    )
    assert back == pytest.approx(0.4)
    assert b.requests > 0

    # one log line per state change, not one per failed scrape
    events = [(e["event"], e.get("target")) for e in sidecar.log_events()]
    assert events.count(("target down", "gone")) == 1
    assert events.count(("target down", "a")) == 1
    assert events.count(("target up", "a")) == 2


def test_promtool_check_metrics_is_clean(sidecar: Sidecar) -> None:
    promtool = need_tool("promtool")
    text = http_get(sidecar.url)
    assert "specdec_acceptance_ratio" in text
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text.encode(), capture_output=True
    )
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
        result
    )


def test_landing_page_links_metrics(sidecar: Sidecar) -> None:
    page = http_get(sidecar.url.removesuffix("metrics"))
    assert 'href="metrics"' in page and "specdec" in page
    assert http_get(sidecar.url.replace("/metrics", "/-/healthy")) == "OK\n"
