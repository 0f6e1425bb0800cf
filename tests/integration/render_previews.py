"""Re-render docs/img/*.png (the README's preview): the tests' live stack at real speed (the
demo with a day of backfilled history, Debian's Prometheus with the shipped rules) running
`specdec demo --scenario drop`: eight quiet minutes, then eight in which the coding agent's
clients sample at temperature 0.9 (a traffic change) while the engine accepts less of the
voice chat's drafts (an engine change), so SpecDecodeAcceptanceDrop fires for both and the
Payoff board's "Why acceptance moved" row names each cause; rendered over the last 20 minutes
by the docs tool (harness/previews), that row also on its own (specdec-payoff-why.png). About
17 minutes; `make previews`."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from dashboards.boards.build import dashboards
from dashboards.boards.panels import JSON
from harness.previews.render import preview
from tests.integration.live import REPO, live_stack

QUIET_S = DROPPED_S = 8 * 60
RANGE_S = 20 * 60
ROW = "Why acceptance moved"


def why_row(board: JSON) -> JSON:
    """The Payoff board cut to its "Why acceptance moved" row, moved to the top."""
    first = next(p for p in board["panels"] if p["title"].startswith(ROW))
    top = first["gridPos"]["y"]
    panels = [
        {**p, "gridPos": {**p["gridPos"], "y": p["gridPos"]["y"] - top}}
        for p in board["panels"]
        if p["gridPos"]["y"] >= top
    ]
    return {
        **board,
        "uid": f"{board['uid']}-why",
        "title": f"{board['title']}: {ROW}",
        "panels": panels,
    }


def main() -> int:
    out = REPO / "docs" / "img"
    with (
        tempfile.TemporaryDirectory(prefix="specdec-previews-") as tmp,
        live_stack(Path(tmp), speed=1.0, scenario="drop", drop_after=QUIET_S) as live,
    ):
        print(f"live stack up ({live.prometheus}); {QUIET_S // 60} quiet minutes", flush=True)
        time.sleep(QUIET_S + DROPPED_S)  # a scripted scenario, not a test: time is the point here
        now = time.time()
        boards = dashboards()
        for data in [*boards.values(), why_row(boards["specdec-payoff"])]:
            print("wrote", preview(data, live.prometheus, out, {}, RANGE_S, now), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
