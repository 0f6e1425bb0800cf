"""Re-render docs/img/*.png (the README's preview): the tests' live stack at real speed (the
demo with a day of backfilled history, Debian's Prometheus with the shipped rules), eight
quiet minutes, then voice_chat's acceptance at 15 % for eight more (SpecDecodeAcceptanceDrop
fires), rendered over the last 20 minutes by the docs tool (harness/previews). About 17
minutes; `make previews`."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from dashboards.boards.build import dashboards
from harness.previews.render import preview
from tests.integration.live import REPO, live_stack, post_json

QUIET_S = DROPPED_S = 8 * 60
RANGE_S = 20 * 60


def main() -> int:
    out = REPO / "docs" / "img"
    with (
        tempfile.TemporaryDirectory(prefix="specdec-previews-") as tmp,
        live_stack(Path(tmp), speed=1.0) as live,
    ):
        print(f"live stack up ({live.prometheus}); {QUIET_S // 60} quiet minutes", flush=True)
        time.sleep(QUIET_S)  # a scripted scenario, not a test: time is the point here
        post_json(f"{live.sim}/admin/profile", {"name": "ja_chat", "acceptance": 0.15})
        print(f"voice_chat at 15 % for {DROPPED_S // 60} minutes", flush=True)
        time.sleep(DROPPED_S)
        now = time.time()
        for data in dashboards().values():
            print("wrote", preview(data, live.prometheus, out, {}, RANGE_S, now), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
