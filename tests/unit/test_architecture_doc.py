"""docs/architecture.md names every module under exporter/ and dashboards/, and every module it
names exists, and its glossary's names resolve: the map cannot drift from the tree."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
NAMED = re.compile(r"`((?:exporter|dashboards)/[\w/]+\.py)`")


def test_every_module_is_named_and_every_named_module_exists() -> None:
    tree = {
        str(p.relative_to(ROOT))
        for p in [*ROOT.glob("exporter/**/*.py"), *ROOT.glob("dashboards/**/*.py")]
    }
    named = set(NAMED.findall(DOC.read_text(encoding="utf-8")))
    assert not tree - named, f"modules docs/architecture.md does not name: {sorted(tree - named)}"
    assert not named - tree, (
        f"docs/architecture.md names modules that do not exist: {sorted(named - tree)}"
    )


GLOSSED = re.compile(r"`((?:exporter|dashboards)[\w.]*):(\w+)`")


def test_every_name_in_the_glossary_resolves() -> None:
    text = DOC.read_text(encoding="utf-8")
    glossary = text[text.index("## Glossary") : text.index("## What each module may import")]
    names = GLOSSED.findall(glossary)
    assert len(names) >= 15
    missing = [f"{m}:{n}" for m, n in names if not hasattr(importlib.import_module(m), n)]
    assert not missing, f"glossary names that no longer exist: {missing}"
