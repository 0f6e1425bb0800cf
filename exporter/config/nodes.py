"""Reading YAML node by node, so every error can name the file, the line and the key."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar
from urllib.parse import urlsplit

import yaml

from exporter.core.durations import parse_seconds
from exporter.core.windows import Window, parse_window

T = TypeVar("T")


class ConfigError(Exception):
    """A configuration error, located: `file:line: key: message`."""

    def __init__(self, source: str, line: int | None, key: str, message: str) -> None:
        where = source if line is None else f"{source}:{line}"
        super().__init__(f"{where}: {key}: {message}" if key else f"{where}: {message}")


class Reader:
    """Walks the YAML node tree, converting and checking as it goes."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, node: yaml.Node | None, key: str, message: str) -> ConfigError:
        return ConfigError(
            self.source, None if node is None else node.start_mark.line + 1, key, message
        )

    def mapping(
        self, node: yaml.Node, key: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()
    ) -> dict[str, yaml.Node]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, key, "expected a mapping of key: value")
        result: dict[str, yaml.Node] = {}
        for k, v in node.value:
            name = k.value if isinstance(k, yaml.ScalarNode) else None
            where = f"{key}.{name}" if key else str(name)
            if name not in allowed:
                raise self.fail(k, where, f"unknown key; expected one of: {', '.join(allowed)}")
            if name in result:
                raise self.fail(k, where, "given twice")
            result[name] = v
        for name in required:
            if name not in result:
                raise self.fail(node, f"{key}.{name}" if key else name, "missing (required)")
        return result

    def scalar(self, node: yaml.Node, key: str, convert: Callable[[str], T], what: str) -> T:
        if not isinstance(node, yaml.ScalarNode) or node.value == "":
            raise self.fail(node, key, f"expected {what}")
        try:
            return convert(node.value)
        except ValueError as exc:
            raise self.fail(node, key, f"expected {what}, got {node.value!r} ({exc})") from None

    def seconds(self, node: yaml.Node, key: str) -> float:
        value = self.scalar(node, key, parse_seconds, "a duration such as 1, 2.5, 500ms or 10s")
        if not 0 < value <= 3600:
            raise self.fail(node, key, f"must be between 0 and 1h, got {node.value!r}")
        return value

    def window(self, text: str, node: yaml.Node | None, key: str) -> Window:
        try:
            return parse_window(text)
        except ValueError as exc:
            raise self.fail(node, key, str(exc)) from None

    def check_url(self, url: str, node: yaml.Node | None, key: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise self.fail(node, key, f"expected an http(s)://HOST:PORT/metrics URL, got {url!r}")
        try:
            parts.port  # noqa: B018  (raises ValueError: port not a number or out of range)
        except ValueError:
            raise self.fail(node, key, f"bad port in URL {url!r}") from None
        return url

    def listen_address(self, text: str, node: yaml.Node | None, key: str) -> tuple[str, int]:
        host, sep, port = text.rpartition(":")
        digits = port.isascii() and port.isdigit() and len(port) <= 5  # int("²") raises
        if not sep or not digits or not 0 < int(port) < 65536:
            raise self.fail(node, key, f"expected HOST:PORT (or :PORT), got {text!r}")
        return (host.strip("[]") or "0.0.0.0", int(port))

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

    def sequence(self, node: yaml.Node, key: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            raise self.fail(node, key, "expected a non-empty list")
        return list(node.value)
