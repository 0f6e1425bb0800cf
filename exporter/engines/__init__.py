"""The serving engines the sidecar reads, one module each behind `base.Engine` (each side sees
it through its own hooks); this registry is what a config's `engine:` is checked against.
Adding an engine is one module here and its recorded fixtures
(tests/inprocess/test_engine_contracts.py runs each through the same contracts;
tests/unit/test_engine_registry.py checks the registry itself)."""

from __future__ import annotations

from exporter.engines import llamacpp, sglang, trtllm, vllm
from exporter.engines.base import Engine

ENGINES: dict[str, Engine] = {
    e.kind: e for e in (vllm.ENGINE, sglang.ENGINE, llamacpp.ENGINE, trtllm.ENGINE)
}
KINDS = tuple(ENGINES)
DEFAULT = vllm.ENGINE
DEFAULT_KIND = DEFAULT.kind  # a target's `engine:` when it names none; the verbs' --engine


def engine(kind: str) -> Engine:
    """The engine of `kind`; ValueError naming the known ones otherwise."""
    found = ENGINES.get(kind)
    if found is None:
        raise ValueError(f"unknown engine {kind!r}; expected one of {', '.join(KINDS)}")
    return found


def recognise(page: str) -> Engine | None:
    """The engine whose own metric prefix a /metrics page's samples carry (a plain server's
    page too: its batch gauge has it), or None when no known engine's does."""
    found = {
        e.kind: e
        for line in page.splitlines()
        if line and not line.startswith("#")
        for e in ENGINES.values()
        if line.startswith(e.prefix)
    }
    return next(iter(found.values())) if len(found) == 1 else None
