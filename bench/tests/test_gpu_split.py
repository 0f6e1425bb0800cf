"""The per-route plain split's analysis (`bench/gpu/split.py`) and the timelines it reads."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp import web

from bench.gpu import split
from bench.gpu.traffic import AGENT, VOICE, Span, phase


def engine(hole_cost: float, steps: int = 3000, workers: int = 8) -> list[Span]:
    """A closed loop on a step engine: even clients send 4-token requests ("voice"), odd ones
    12-token ones ("agent"); a request is out of the batch for 2 steps (round trip, prefill)
    and then decodes a token a step. A step takes 1 ms, plus `hole_cost` ms per client out
    of the batch (llama-server's pass per run of busy slots)."""
    tokens = {0: 4, 1: 12}
    names = {0: "voice", 1: "agent"}
    state = [{"sent": 0.0, "gap": 2, "first": 0.0, "done": 0} for _ in range(workers)]
    spans: list[Span] = []
    now = 0.0
    for _ in range(steps):
        now += 1.0 + hole_cost * sum(1 for s in state if s["gap"] > 0)
        for w, s in enumerate(state):
            if s["gap"] > 0:
                s["gap"] -= 1
                if s["gap"] == 0:
                    s["first"] = now
                continue
            s["done"] += 1
            if s["done"] == tokens[w % 2]:
                spans.append(Span(names[w % 2], w, s["sent"], s["first"], now, s["done"], True))
                s.update(sent=now, gap=2, done=0)
    return spans


def test_a_client_out_of_the_batch_is_a_gap_from_its_last_event_to_its_next_first() -> None:
    spans = [
        Span("voice", 0, 0.0, 0.5, 2.0, 5, True),
        Span("voice", 0, 2.0, 2.4, 3.0, 2, True),
        Span("agent", 1, 0.0, 0.7, 3.0, 9, False),
    ]
    assert split.gap_intervals(spans) == [(0, 0.0, 0.5), (0, 2.0, 2.4), (1, 0.0, 0.7)]
    # the agent's decode (0.7-3.0) saw client 0 out of the batch for 0.4 s of its 2.3 s
    assert split.gaps_seen(spans[2], split.gap_intervals(spans)) == pytest.approx(0.4 / 2.3)


def test_slower_steps_while_a_slot_is_out_split_the_routes_and_the_gaps_explain_it() -> None:
    rows = {r.route: r for r in split.split(engine(hole_cost=0.25))}
    voice, agent = rows["voice"], rows["agent"]
    assert voice.rate and agent.rate and voice.gaps is not None and agent.gaps is not None
    observed = voice.rate / agent.rate
    assert observed > 1.03  # the shorter requests' route decodes faster on the same steps
    assert voice.gaps < agent.gaps  # its own clients are the ones out of the batch
    assert voice.predicted and agent.predicted
    assert voice.predicted / agent.predicted - 1 == pytest.approx(observed - 1, rel=0.2)


def test_without_a_cost_per_gap_the_routes_decode_alike_and_the_line_says_so() -> None:
    rows = {r.route: r for r in split.split(engine(hole_cost=0.0))}
    voice, agent = rows["voice"], rows["agent"]
    assert voice.rate == pytest.approx(agent.rate, rel=1e-9)
    assert voice.predicted == pytest.approx(agent.predicted, rel=1e-6)


def test_a_timeline_file_round_trips_and_the_cli_prints_each_route(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "timelines" / "mixed-c8-r1-plain.jsonl"
    split.write(path, engine(hole_cost=0.5, steps=300))
    assert split.read(path) == engine(hole_cost=0.5, steps=300)
    assert split.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("mixed-c8-r1-plain.jsonl: voice ") and "; agent " in out
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"route": "voice"}\n', encoding="utf-8")
    assert split.main([str(bad)]) == 2
    assert capsys.readouterr().err.startswith(f"split: {bad}: ")


async def _llama_stream(request: web.Request) -> web.StreamResponse:
    """llama-server's streamed chat, as the bench reads it: 3 tokens, one event each."""
    body = await request.json()
    resp = web.StreamResponse()
    await resp.prepare(request)
    assert body["id_slot"] in (0, 1)
    try:
        for n in (1, 2, 3):
            chunk = {"choices": [{"delta": {"content": "x"}}], "timings": {"predicted_n": n}}
            line = json.dumps(chunk, separators=(",", ":"))
            await resp.write(f"data: {line}\n\n".encode())
            await asyncio.sleep(0.01)
        await resp.write_eof()
    except ConnectionResetError:  # the phase ended: its client cancelled the stream
        pass
    return resp


def test_a_phase_records_every_requests_span_per_client() -> None:
    async def go() -> tuple[list[Span], dict[str, float]]:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", _llama_stream)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        spans: list[Span] = []
        try:
            rates, failed = await phase(f"http://127.0.0.1:{port}", [VOICE, AGENT], 2, 0.5,
                                        timeline=spans)  # fmt: skip
        finally:
            await runner.cleanup()
        assert failed == 0
        return spans, {name: r.tokens for name, r in rates.items()}

    spans, tokens = asyncio.run(go())
    assert {s.worker for s in spans} == {0, 1}
    assert {s.route for s in spans if s.worker == 0} == {VOICE.name}
    for route in (VOICE.name, AGENT.name):  # the spans hold what the rates counted
        assert sum(s.decoded for s in spans if s.route == route) == tokens[route]
    done = [s for s in spans if s.finished]
    assert done and all(s.decoded == 2 and 0 <= s.sent < s.first < s.last for s in done)
