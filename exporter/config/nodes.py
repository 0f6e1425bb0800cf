"""Reading YAML node by node, so every error can name the file, the line and the key.

Each check takes (reader, node, key) and returns the value or raises ConfigError; a reader
collects the errors of a whole file (`attempt`), so one run reports all of them, in the file's
order. A value tagged `!placeholder` stands in for the user's own (`placeholders`).
"""

from __future__ import annotations

import string
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import yaml

from exporter.core.durations import parse_seconds
from exporter.core.windows import Window, parse_window

T = TypeVar("T")
Check = Callable[["Reader", yaml.Node, str], Any]
INVALID: Any = object()  # what `attempt` returns for a value whose check failed
PLACEHOLDER = "!placeholder"  # the YAML tag of a value that stands in for the user's own


class ConfigError(Exception):
    """Configuration errors, located: one `file:line: key: message` line each."""

    def __init__(self, source: str, line: int | None, key: str, message: str) -> None:
        where = source if line is None else f"{source}:{line}"
        self.line = line
        self.messages = [f"{where}: {key}: {message}" if key else f"{where}: {message}"]
        super().__init__(self.messages[0])

    @classmethod
    def several(cls, errors: Iterable[ConfigError]) -> ConfigError:
        """One error carrying the lines of `errors`, in order."""
        errors = list(errors)
        combined = errors[0]
        combined.messages = [m for e in errors for m in e.messages]
        combined.args = ("\n".join(combined.messages),)
        return combined


def compose(path: str | Path) -> yaml.Node | None:
    """A YAML file's node tree (None when it holds no document); ConfigError, located, when it
    cannot be read or is not YAML."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(source, None, "", f"cannot read: {exc}") from exc
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = None if mark is None else mark.line + 1
        message = f"not valid YAML: {getattr(exc, 'problem', exc)}"
        raise ConfigError(source, line, "", message) from exc


class Reader:
    """Walks the YAML node tree, converting and checking as it goes."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.errors: list[ConfigError] = []
        # each field's value that passed its own check, by key path (`targets[0].interval`):
        # a check across fields runs on them even where the rest of the file has errors
        self.found: dict[str, Any] = {}

    def fail(self, node: yaml.Node | None, key: str, message: str) -> ConfigError:
        return ConfigError(
            self.source, None if node is None else node.start_mark.line + 1, key, message
        )

    def attempt(self, check: Check, node: yaml.Node, key: str) -> Any:
        """`check`'s value, or INVALID with its error kept: the rest of the file is read on."""
        try:
            return check(self, node, key)
        except ConfigError as exc:
            self.errors.append(exc)
            return INVALID

    def raise_errors(self) -> None:
        """Every error kept, in the file's order: one fix-up pass from top to bottom (the
        checks run in the schema's order, and a cross-field check after the fields)."""
        if self.errors:
            raise ConfigError.several(sorted(self.errors, key=lambda e: e.line or 0))

    def mapping(
        self, node: yaml.Node, key: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()
    ) -> dict[str, yaml.Node]:
        """The allowed keys of a mapping; unknown, repeated and missing keys are errors (all
        kept); a node that is not a mapping raises."""
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, key, "expected a mapping of key: value")
        result: dict[str, yaml.Node] = {}
        for k, v in node.value:
            name = k.value if isinstance(k, yaml.ScalarNode) else None
            where = f"{key}.{name}" if key else str(name)
            if name not in allowed:
                self.errors.append(
                    self.fail(k, where, f"unknown key; expected one of: {', '.join(allowed)}")
                )
            elif name in result:
                self.errors.append(self.fail(k, where, "given twice"))
            else:
                result[name] = v
        for name in required:
            if name not in result:
                self.errors.append(
                    self.fail(node, f"{key}.{name}" if key else name, "missing (required)")
                )
        return result

    def scalar(self, node: yaml.Node, key: str, convert: Callable[[str], T], what: str) -> T:
        if not isinstance(node, yaml.ScalarNode) or node.value == "":
            raise self.fail(node, key, f"expected {what}")
        try:
            return convert(node.value)
        except ValueError:
            raise self.fail(node, key, f"expected {what}, got {node.value!r}") from None

    def sequence(
        self, node: yaml.Node, key: str, what: str = "a non-empty list"
    ) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            raise self.fail(node, key, f"expected {what}")
        return list(node.value)

    def seconds(self, node: yaml.Node, key: str) -> float:
        value = self.scalar(node, key, parse_seconds, "a duration such as 1, 2.5, 500ms or 10s")
        if not 0 < value <= 3600:
            raise self.fail(node, key, f"must be more than 0 and at most 1h, got {node.value!r}")
        return value

    def window(self, text: str, node: yaml.Node | None, key: str) -> Window:
        try:
            return parse_window(text)
        except ValueError as exc:
            raise self.fail(node, key, str(exc)) from None

    def windows(self, node: yaml.Node, key: str) -> tuple[Window, ...]:
        items = self.sequence(node, key, "a non-empty list such as [1m, 5m, 15m]")
        result = []
        for i, item in enumerate(items):
            text = self.scalar(item, f"{key}[{i}]", str, "a duration such as 5m")
            result.append(self.window(text, item, f"{key}[{i}]"))
        if len({w.seconds for w in result}) != len(result):
            raise self.fail(node, key, "the same window is given twice")
        return tuple(result)

    def check_url(
        self, url: str, node: yaml.Node | None, key: str, shape: str = "http(s)://HOST:PORT/metrics"
    ) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise self.fail(node, key, f"expected an {shape} URL, got {url!r}")
        try:
            parts.port  # noqa: B018  (raises ValueError: port not a number or out of range)
        except ValueError:
            raise self.fail(node, key, f"bad port in URL {url!r}") from None
        return url

    def url(self, node: yaml.Node, key: str) -> str:
        return self.check_url(self.scalar(node, key, str, "a URL"), node, key)

    def listen_address(self, text: str, node: yaml.Node | None, key: str) -> tuple[str, int]:
        host, sep, port = text.rpartition(":")
        digits = port.isascii() and port.isdigit() and len(port) <= 5  # int("²") raises
        if not sep or not digits or not 0 < int(port) < 65536:
            raise self.fail(node, key, f"expected HOST:PORT (or :PORT), got {text!r}")
        return (host.strip("[]") or "0.0.0.0", int(port))

    def listen(self, node: yaml.Node, key: str) -> tuple[str, int]:
        return self.listen_address(self.scalar(node, key, str, "HOST:PORT"), node, key)

    def number(self, node: yaml.Node, key: str, low: float, high: float) -> float:
        value = self.scalar(node, key, float, "a number")
        if not low <= value <= high:
            raise self.fail(node, key, f"must be between {low:g} and {high:g}, got {node.value!r}")
        return value

    def name(self, node: yaml.Node, key: str) -> str:
        """A label value: letters, digits and _.:- only."""
        text = self.scalar(node, key, str, "a name")
        if not all(c.isascii() and (c.isalnum() or c in "_.:-") for c in text) or len(text) > 64:
            raise self.fail(node, key, f"use letters, digits and _.:- only, got {text!r}")
        return text

    def text(self, node: yaml.Node, key: str) -> str:
        return self.scalar(node, key, str, "a string")


@dataclass(frozen=True, slots=True)
class Placeholder:
    """A value the file tags `!placeholder` (the starter config's examples): it loads and
    runs, but is nobody's real figure, so `specdec serve --check` names it."""

    source: str
    line: int
    key: str
    value: str  # as shown: a scalar quoted as written, else what the list or mapping is

    def __str__(self) -> str:
        return (
            f"{self.source}:{self.line}: {self.key}: {self.value} is a placeholder "
            f"({PLACEHOLDER}): put in your own and drop the tag"
        )


def placeholders(source: str, node: yaml.Node | None, key: str = "") -> Iterator[Placeholder]:
    """Every node tagged `!placeholder` under `node`, in the file's order, with its key path
    as errors name it (`models[0].step_cost_ratio`)."""
    if node is None:
        return
    if node.tag == PLACEHOLDER:
        if isinstance(node, yaml.ScalarNode):
            shown = repr(node.value)
        else:
            kind = "list" if isinstance(node, yaml.SequenceNode) else "mapping"
            n = len(node.value)
            shown = f"the {kind} ({n} item{'' if n == 1 else 's'})"
        yield Placeholder(source, node.start_mark.line + 1, key or "(the file)", shown)
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            name = k.value if isinstance(k, yaml.ScalarNode) else "?"
            yield from placeholders(source, v, f"{key}.{name}" if key else name)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from placeholders(source, item, f"{key}[{i}]")


# --- checks, for the `check` of a config field (schema.py) ----------------------------------


def number(low: float, high: float) -> Check:
    return lambda r, node, key: r.number(node, key, low, high)


def whole(low: int, high: int) -> Check:
    def check(r: Reader, node: yaml.Node, key: str) -> int:
        value = r.number(node, key, low, high)
        if value != int(value):
            raise r.fail(node, key, f"expected a whole number, got {node.value!r}")
        return int(value)

    return check


def one_of(choices: tuple[str, ...], what: str) -> Check:
    def check(r: Reader, node: yaml.Node, key: str) -> str:
        value = r.scalar(node, key, str, what)
        if value not in choices:
            raise r.fail(node, key, f"expected one of {', '.join(choices)}, got {value!r}")
        return value

    return check


def metric_prefix(r: Reader, node: yaml.Node, key: str) -> str:
    prefix = r.scalar(node, key, str, "a metric prefix such as vllm:")
    if not all(c in string.ascii_letters + string.digits + "_:" for c in prefix):
        raise r.fail(node, key, f"not a metric name prefix: {prefix!r}")
    return prefix


def described(what: str) -> Check:
    """Any non-empty string, described as `what` when it is missing."""
    return lambda r, node, key: r.scalar(node, key, str, what)
