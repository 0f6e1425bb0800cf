"""Build the Grafana dashboards: the JSON (`dashboards/<uid>.json`, where users deploy it from)
and a check for CI. The command line is `specdec dashboards` (dashboards/cli.py); the PNG
previews are a docs tool outside the package (harness/previews)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dashboards.boards import engine, health, payoff, requests
from dashboards.boards.encode import to_json
from dashboards.boards.panels import JSON
from dashboards.config import DEFAULT, Mixin

DIRECTORY = Path(__file__).resolve().parents[1]  # dashboards/: the JSON's committed place
BUILDERS: tuple[Callable[[Mixin], Any], ...] = (
    payoff.build,
    requests.build,
    engine.build,
    health.build,
)


def dashboards(mix: Mixin = DEFAULT) -> dict[str, JSON]:
    """uid -> normalised dashboard JSON, in a fixed order."""
    built = [to_json(build(mix)) for build in BUILDERS]
    return {str(data["uid"]): data for data in built}


def render(data: JSON) -> str:
    """Stable text: sorted keys, two-space indent, final newline."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write(directory: Path = DIRECTORY, check: bool = False, mix: Mixin = DEFAULT) -> list[Path]:
    """Write `<uid>.json` under `directory`; return the files that were (or, with `check`,
    would be) changed, including `<prefix>-*.json` files no dashboard produces any more."""
    wanted = {directory / f"{uid}.json": render(data) for uid, data in dashboards(mix).items()}
    stale = [
        path
        for path, text in wanted.items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]
    extra = sorted(set(directory.glob(f"{mix.dashboards.uid_prefix}-*.json")) - set(wanted))
    if not check:
        for path in stale:
            path.write_text(wanted[path], encoding="utf-8")
        for path in extra:
            path.unlink()
    return stale + extra
