"""Scenario packs: prompts of one workload plus its system prompt and token cap.

`ja_chat` (Japanese voice chat with a persona) and `code_agent` (English coding tasks) ship
with the package; `specdec demo` sends them as traffic and `specdec measure` replays them.
Users bring their own in YAML (a mapping, or a list of them) or JSONL (one scenario a line),
with the same fields: name, max_tokens, system (optional), prompts, extra_body (optional:
request fields sent as they are with each request, e.g. the sampling a workload uses) and
weight (optional, default 1: its requests against the others' in the mix `measure
--concurrency` replays the scenarios in; a step's seconds depend on the mix's lengths).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

BUILTIN = ("ja_chat", "code_agent")
FIELDS = ("name", "max_tokens", "system", "prompts", "extra_body", "weight")
OWN = ("model", "messages", "max_tokens", "stream", "stream_options")  # what measure sends


_FILLER = tuple(
    "river stone garden window paper orange music yellow summer winter forest letter bridge "
    "market silver candle travel mirror pocket ladder island carpet engine harbor circle "
    "button jacket planet pencil rabbit saddle tunnel violin wallet zipper anchor basket "
    "cotton dragon feather glacier hammer insect jungle kettle lemon marble needle".split()
)


class ScenarioError(Exception):
    """A bad scenario file, located: `file:line: message`."""


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    max_tokens: int
    system: str | None
    prompts: tuple[str, ...]
    extra_body: tuple[tuple[str, Any], ...] = ()  # request fields sent with each request
    weight: float = 1.0  # its requests against the others' in a mixed replay

    def lengthened(self, tokens: int) -> Scenario:
        """The same requests with about `tokens` more tokens of context: a note of words in
        no repeating order (an n-gram drafter finds nothing in it to copy) before the system
        prompt. How many tokens it makes is the engine's to say (its usage), not assumed."""
        words = random.Random(f"{self.name}/{tokens}").choices(_FILLER, k=tokens)
        note = "Background notes, not part of the task: " + " ".join(words) + "."
        return replace(self, system=note if not self.system else f"{note}\n\n{self.system}")

    def messages(self, index: int) -> list[dict[str, str]]:
        """The chat messages of prompt `index` (wrapping around)."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, {"role": "user", "content": self.prompts[index % len(self.prompts)]}]


def builtin(name: str) -> Scenario:
    """A scenario pack shipped with specdec; KeyError for an unknown name."""
    if name not in BUILTIN:
        raise KeyError(f"unknown scenario {name!r}; built in: {', '.join(BUILTIN)}")
    text = resources.files(__package__).joinpath(f"{name}.yaml").read_text(encoding="utf-8")
    return from_mapping(yaml.safe_load(text), name)


def load_file(path: Path) -> list[Scenario]:
    """Scenarios from a user's YAML or JSONL file; ScenarioError naming file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{path}: cannot read: {exc}") from exc
    if path.suffix == ".jsonl":
        items: list[tuple[int, Any]] = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    items.append((number, json.loads(line)))
                except ValueError as exc:
                    raise ScenarioError(f"{path}:{number}: not JSON: {exc}") from None
    else:
        try:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark else str(path)
            raise ScenarioError(
                f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}"
            ) from None
        if node is None:
            raise ScenarioError(f"{path}:1: the file is empty")
        nodes = node.value if isinstance(node, yaml.SequenceNode) else [node]
        values = data if isinstance(data, list) else [data]
        items = [(n.start_mark.line + 1, v) for n, v in zip(nodes, values, strict=True)]
    if not items:
        raise ScenarioError(f"{path}:1: no scenarios in the file")
    scenarios = [from_mapping(value, f"{path}:{line}") for line, value in items]
    names = [s.name for s in scenarios]
    if len(set(names)) != len(names):
        raise ScenarioError(f"{path}: scenario names must be unique, got {names}")
    return scenarios


def from_mapping(data: Any, where: str) -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}: expected a mapping with {', '.join(FIELDS)}")
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise ScenarioError(f"{where}: unknown key {unknown[0]!r}; expected {', '.join(FIELDS)}")
    for key in ("name", "max_tokens", "prompts"):
        if key not in data:
            raise ScenarioError(f"{where}: {key}: missing (required)")
    name, cap, prompts, system = (
        data["name"],
        data["max_tokens"],
        data["prompts"],
        data.get("system"),
    )
    if not isinstance(name, str) or not name:
        raise ScenarioError(f"{where}: name: expected a non-empty string")
    if not isinstance(cap, int) or isinstance(cap, bool) or not 1 <= cap <= 1_000_000:
        raise ScenarioError(f"{where}: max_tokens: expected a whole number >= 1, got {cap!r}")
    if (
        not isinstance(prompts, list)
        or not prompts
        or not all(isinstance(p, str) and p for p in prompts)
    ):
        raise ScenarioError(f"{where}: prompts: expected a non-empty list of non-empty strings")
    if system is not None and not isinstance(system, str):
        raise ScenarioError(f"{where}: system: expected a string")
    extra = data.get("extra_body") or {}
    if not isinstance(extra, dict) or not all(isinstance(k, str) for k in extra):
        raise ScenarioError(f"{where}: extra_body: expected a mapping of request fields")
    taken = sorted(set(extra) & set(OWN))
    if taken:
        raise ScenarioError(
            f"{where}: extra_body: {taken[0]!r} is set by measure itself; "
            f"extra_body cannot hold {', '.join(OWN)}"
        )
    weight = data.get("weight", 1.0)
    if not isinstance(weight, int | float) or isinstance(weight, bool) or not 0 < weight <= 1e6:
        raise ScenarioError(
            f"{where}: weight: expected a number > 0 (its requests against the other "
            f"scenarios'), got {weight!r}"
        )
    return Scenario(name, cap, system, tuple(prompts), tuple(extra.items()), float(weight))
