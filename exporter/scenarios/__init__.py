"""Scenario packs: prompts of one workload plus its system prompt and token cap.

`ja_chat` (Japanese voice chat with a persona) and `code_agent` (English coding tasks) ship
with the package; `specdec demo` sends them as traffic and `specdec measure` replays them.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

BUILTIN = ("ja_chat", "code_agent")


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    max_tokens: int
    system: str | None
    prompts: tuple[str, ...]

    def messages(self, index: int) -> list[dict[str, str]]:
        """The chat messages of prompt `index` (wrapping around)."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, {"role": "user", "content": self.prompts[index % len(self.prompts)]}]


def builtin(name: str) -> Scenario:
    """A scenario pack shipped with specdec; KeyError for an unknown name."""
    if name not in BUILTIN:
        raise KeyError(f"unknown scenario {name!r}; built in: {', '.join(BUILTIN)}")
    text = resources.files(__package__).joinpath(f"{name}.yaml").read_text(encoding="utf-8")
    data: dict[str, Any] = yaml.safe_load(text)
    return Scenario(
        data["name"], int(data["max_tokens"]), data.get("system"), tuple(data["prompts"])
    )
