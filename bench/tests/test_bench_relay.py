"""bench/bench_relay.py drives the real proxy with fake transports: it must relay whole
streams (each one accounted), or its per-stream figures would time a shortcut."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1]


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # bench_relay imports _run by name
    spec.loader.exec_module(module)
    return module


load("_run")
relay = load("bench_relay")


async def test_figures_come_from_whole_streams(tmp_path: Path) -> None:
    out = tmp_path / "relay.json"
    args = relay.parse_args(["--n", "5", "--repeats", "1", "--thrash-kb", "64", "--json", str(out)])
    assert await relay.main(args) == 0
    figures = json.loads(out.read_text())
    assert figures["reads"]["3"] < figures["reads"]["1"]
    for k in ("1", "3"):
        proxy, reference = (
            figures["us_per_stream"][f"proxy/{k}"],
            figures["us_per_stream"][f"reference/{k}"],
        )
        assert proxy["warm"] > reference["warm"] > 0  # the proxy does strictly more than forward


async def test_a_stream_cut_short_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    recorded = await relay.record(16)
    monkeypatch.setattr(relay, "record", lambda _tokens: _cut(recorded))
    args = relay.parse_args(["--n", "2", "--repeats", "1", "--thrash-kb", "64"])
    with pytest.raises(RuntimeError, match=r"streams accounted|nothing reached"):
        await relay.main(args)


async def _cut(recorded: list[bytes]) -> list[bytes]:
    return recorded[:-1]  # the terminal chunk never comes: no stream ends
