"""From a histogram bucket to the request behind it, on the real parts: Debian's Prometheus with
exemplar storage on scrapes `specdec serve` (which it asks for OpenMetrics, as by default), in
front of `specdec sim`, with the request log on.

The test's clients send mixed traffic through the proxy, each request with its own
`traceparent`: Japanese chat made low-acceptance on the simulator (ja_chat at 0.02, every
request alike) and code at 0.8. Then `/api/v1/query_exemplars` for the acceptance histogram
returns only trace ids the clients sent, the lowest bucket's is one of the low requests, the
simulator received that very `traceparent`, and the sidecar's request log has its line; the
TTFT and decode-rate histograms hold exemplars of the test's requests too.

What it takes (~7 s on 2 cores): three child processes starting (Prometheus ~2 s, the sidecar
and the simulator ~1 s each), 16 short streamed completions at 50x speed (~1 s), and polling
until Prometheus has scraped the sidecar after the last of them (1 s scrapes). The real
vLLM-CPU part of the issue is not here: its fixture (tests/integration/test_real_vllm.py)
starts a CPU model for minutes and runs without speculation's per-request objects on CPU, so
it would add minutes for one header that test_trace_context's echo upstream already pins."""

from __future__ import annotations

import functools
import json
import os
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from harness.helpers import child, free_port, need_tool, specdec, wait_for

pytestmark = pytest.mark.timeout(60)
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
JA = "こんにちは！週末は何してた？"
CODE = "def merge(a, b): write a Python function that merges two sorted lists"


def _get(url: str, headers: dict[str, str] | None = None) -> Any:
    request = urllib.request.Request(url, headers=headers or {})
    with _DIRECT.open(request, timeout=5) as resp:
        return json.loads(resp.read())


def _post(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, str]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json", **headers}
    )
    with _DIRECT.open(request, timeout=10) as resp:
        resp.read()
        return resp.status, resp.headers["traceresponse"]


def test_the_lowest_buckets_exemplar_is_a_low_request_the_engine_and_the_log_saw(
    tmp_path: Path,
) -> None:
    prometheus = need_tool("prometheus")
    sim_port, metrics_port, proxy_port, prom_port = (free_port() for _ in range(4))
    config = tmp_path / "specdec.yaml"
    config.write_text(
        f"listen: 127.0.0.1:{metrics_port}\n"
        f"targets: [{{name: sim, url: 'http://127.0.0.1:{sim_port}/metrics', interval: 1s}}]\n"
        "proxy:\n"
        f"  listen: 127.0.0.1:{proxy_port}\n"
        f"  upstream: http://127.0.0.1:{sim_port}\n"
        "  target: sim\n"
        "  request_log: {enabled: true, sample: 0, low_acceptance: 0.2}\n"
    )
    prom_config = tmp_path / "prometheus.yml"
    prom_config.write_text(
        "global: {scrape_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - {{job_name: specdec, static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]}}\n"
    )
    with ExitStack() as stack:
        sim = f"http://127.0.0.1:{sim_port}"
        stack.enter_context(
            child(
                specdec("sim", "--listen", f"127.0.0.1:{sim_port}", "--speed", "50"),
                tmp_path / "sim.log",
            )
        )
        sidecar_log = tmp_path / "sidecar.log"
        stack.enter_context(child(specdec("serve", "--config", str(config)), sidecar_log))
        stack.enter_context(
            child(
                [
                    prometheus,
                    f"--config.file={prom_config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                    "--enable-feature=exemplar-storage",
                    "--log.level=warn",
                ],
                tmp_path / "prometheus.log",
            )
        )
        proxy, prom = f"http://127.0.0.1:{proxy_port}", f"http://127.0.0.1:{prom_port}"
        wait_for(lambda: _ready(f"{proxy}/v1/models"), 20, "the proxy and the simulator")
        wait_for(lambda: _ready(f"{prom}/-/ready"), 20, "prometheus")
        for name, acceptance in (("ja_chat", 0.02), ("code_agent", 0.8)):
            _post_admin(sim, {"name": name, "acceptance": acceptance, "concentration": "inf"})

        sent: dict[str, str] = {}  # trace id -> traceparent
        low: set[str] = set()

        def one(i: int) -> None:
            trace_id, parent = os.urandom(16).hex(), os.urandom(8).hex()
            header = f"00-{trace_id}-{parent}-01"
            body = {
                "messages": [{"role": "user", "content": JA if i % 2 else CODE}],
                "stream": True,
                "max_tokens": 40,
            }
            status, back = _post(f"{proxy}/v1/chat/completions", body, {"traceparent": header})
            assert status == 200 and back == header
            sent[trace_id] = header
            if i % 2:
                low.add(trace_id)

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(one, range(16)))
        after = time.time()

        def stored(family: str) -> list[tuple[float, dict[str, str]]]:
            """(le, labels) of each exemplar Prometheus holds for `family`'s buckets."""
            query = urllib.parse.urlencode(
                {
                    "query": f"{family}_bucket",
                    "start": str(after - 120),
                    "end": str(time.time() + 5),
                }
            )
            data = _get(f"{prom}/api/v1/query_exemplars?{query}")["data"]
            return [
                (float(series["seriesLabels"]["le"]), ex["labels"])
                for series in data
                for ex in series["exemplars"]
            ]

        def exemplars() -> list[tuple[float, dict[str, str]]] | None:
            found = stored("specdec_route_request_acceptance_ratio")
            # every bucket the traffic filled has its exemplar in: both profiles' buckets
            low_seen = any(labels["trace_id"] in low for _, labels in found)
            high_seen = any(labels["trace_id"] in sent.keys() - low for _, labels in found)
            return sorted(found, key=lambda f: f[0]) if low_seen and high_seen else None

        found = wait_for(exemplars, 20, "exemplars of both profiles in Prometheus")

        def ours(family: str) -> set[str]:
            return {labels["trace_id"] for _, labels in stored(family)} & sent.keys()

        # the streamed requests' TTFT and decode rate: a request of the test's in each family
        for family in ("specdec_route_ttft_seconds", "specdec_route_decode_tokens_per_second"):
            wait_for(functools.partial(ours, family), 20, f"{family}'s exemplars in Prometheus")
        received = {r["id"]: r["traceparent"] for r in _get(f"{sim}/admin/received")}
    assert {labels["trace_id"] for _, labels in found} <= sent.keys()
    lowest_le, lowest = found[0]
    assert lowest_le <= 0.05 and lowest["trace_id"] in low
    assert lowest["request_id"].startswith("chatcmpl-")
    # the engine received that very traceparent, for that very request id
    assert received[lowest["request_id"]] == sent[lowest["trace_id"]]
    # and the request log has its line (the sidecar's stdout: JSON lines)
    text = sidecar_log.read_text()
    lines = [json.loads(line) for line in text.splitlines() if '"event": "request"' in line]
    mine = [e for e in lines if e.get("trace_id") == lowest["trace_id"]]
    assert len(mine) == 1 and mine[0]["kept"] == "low_acceptance"
    assert mine[0]["request_id"] == lowest["request_id"] and mine[0]["acceptance"] < 0.05 + 1e-9
    # sample 0: the code requests (0.8, fast) have no line
    assert {e["trace_id"] for e in lines} == low


def _ready(url: str) -> bool:
    try:
        with _DIRECT.open(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def _post_admin(sim: str, body: dict[str, Any]) -> None:
    request = urllib.request.Request(
        f"{sim}/admin/profile", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with _DIRECT.open(request, timeout=5) as resp:
        assert resp.status == 200
