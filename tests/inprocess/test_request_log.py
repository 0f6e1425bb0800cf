"""From a bucket to its requests, in process: clients send their own `traceparent`, some
requests made low-acceptance on the simulator; the engine received each trace id, the lowest
acceptance bucket's OpenMetrics exemplar is one of the low requests, and the request log has a
line for each low or failed request (and none for the rest at sample 0) with the same trace
id and the engine's request id, and no text of a prompt or a header."""

from __future__ import annotations

import math
import os

import aiohttp
import structlog
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from exporter.config import RequestLogConfig
from exporter.proxy.requestlog import RequestLog, kept
from exporter.sim.profiles import Profile
from harness.rig import CODE, JA, sidecar, simulator

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def traceparent() -> tuple[str, str]:
    trace_id = os.urandom(16).hex()
    return trace_id, f"00-{trace_id}-{os.urandom(8).hex()}-01"


async def test_exemplars_received_headers_and_the_log_name_the_same_requests() -> None:
    logged = RequestLogConfig(enabled=True, sample=0.0, low_acceptance=0.2, slow_ttft=600.0)
    with structlog.testing.capture_logs() as logs:
        async with (
            simulator() as (engine, upstream),
            sidecar(upstream, request_log=logged) as (side, proxy, metrics),
            aiohttp.ClientSession() as session,
        ):
            engine.profiles["ja_chat"] = Profile("ja_chat", 0.02, concentration=math.inf)
            engine.profiles["code_agent"] = Profile("code_agent", 0.8, concentration=math.inf)
            low, high, sent = set(), set(), {}
            for i in range(8):
                trace_id, header = traceparent()
                messages = JA if i % 2 else CODE
                body = {"messages": messages, "stream": True, "max_tokens": 40}
                async with session.post(
                    proxy + "/v1/chat/completions", json=body, headers={"traceparent": header}
                ) as resp:
                    assert resp.status == 200
                    assert resp.headers["traceresponse"] == header
                    await resp.read()
                (low if i % 2 else high).add(trace_id)
                sent[trace_id] = header
            async with session.post(
                proxy + "/v1/chat/completions",
                json={"model": "not-served", "messages": CODE},
                headers={"traceparent": traceparent()[1], "authorization": "Bearer s3cret"},
            ) as resp:
                assert resp.status == 404
            async with session.get(upstream + "/admin/received") as resp:
                received = await resp.json()
            async with session.get(metrics, headers={"Accept": OPENMETRICS}) as resp:
                assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
                page = await resp.text()
            async with session.get(metrics) as resp:
                text = await resp.text()
            assert side.proxy is not None
            side.proxy.request_log.flush()
            lines_total = dict(side.proxy.request_log.lines)
    # the engine got each client's own traceparent, byte for byte
    got = {r["traceparent"] for r in received}
    assert set(sent.values()) <= got
    # the lowest non-empty bucket's exemplar is a low request; every exemplar one of ours
    buckets = []
    for family in text_string_to_metric_families(page):
        if family.name == "specdec_route_request_acceptance_ratio":
            buckets = [s for s in family.samples if s.name.endswith("_bucket")]
    with_exemplar = [s for s in buckets if s.exemplar is not None]
    assert with_exemplar and with_exemplar[0].exemplar.labels["trace_id"] in low
    assert float(with_exemplar[0].labels["le"]) <= 0.05
    assert {s.exemplar.labels["trace_id"] for s in with_exemplar} <= low | high
    ids = {r["id"] for r in received}
    assert all(s.exemplar.labels["request_id"] in ids for s in with_exemplar)
    assert "trace_id" not in text  # the text format: no exemplars
    # the log: the four low ones and the failed one, nothing of a prompt or a header
    lines = [e for e in logs if e["event"] == "request"]
    assert {e["trace_id"] for e in lines if e["kept"] == "low_acceptance"} == low
    assert [e["status"] for e in lines if e["kept"] == "failed"] == ["404"]
    assert lines_total == {"failed": 1, "low_acceptance": 4, "slow": 0, "sampled": 0}
    for e in lines:
        if e["kept"] == "low_acceptance":
            assert e["request_id"] in ids and e["draft_tokens"] > 0 and e["acceptance"] < 0.2
            assert sent[e["trace_id"]] in got
    flat = repr(lines)
    assert "s3cret" not in flat and "merges two sorted" not in flat and "こんにちは" not in flat


def test_sampling_keeps_every_failed_low_and_slow_one_and_a_share_of_the_rest() -> None:
    from exporter.accounting.ledger import RequestOutcome
    from exporter.core.counts import Counts

    config = RequestLogConfig(enabled=True, sample=0.25, low_acceptance=0.3, slow_ttft=1.0)
    ok = RequestOutcome("r", "m", "200", 10, ttft=0.1, exact=Counts(3, 9, 6, (3, 2, 1)))
    assert kept(RequestOutcome("r", "m", "502"), config, 0.99) == "failed"
    low = RequestOutcome("r", "m", "200", 10, ttft=0.1, exact=Counts(3, 9, 1, (1, 0, 0)))
    assert kept(low, config, 0.99) == "low_acceptance"
    slow = RequestOutcome("r", "m", "200", 10, ttft=1.5, exact=Counts(3, 9, 6, (3, 2, 1)))
    assert kept(slow, config, 0.99) == "slow"
    whole = RequestOutcome("r", "m", "200", 10, seconds=3.0)  # not streamed: its whole time
    assert kept(whole, config, 0.99) == "slow"
    assert kept(ok, config, 0.2) == "sampled" and kept(ok, config, 0.3) is None


def test_a_full_queue_drops_and_counts_never_waits() -> None:
    from exporter.accounting.ledger import RequestOutcome

    log = RequestLog(capacity=2)
    log._thread = object()  # type: ignore[assignment]  # a writer that never takes a line
    config = RequestLogConfig(enabled=True, sample=1.0)
    for _ in range(5):
        log.offer(RequestOutcome("r", "m", "502"), config)
    assert (log.lines["failed"], log.dropped) == (2, 3)
