"""The sidecar's configuration: one YAML file -> typed, validated dataclasses.

Every error names the file, the line and the key (`specdec.yaml:7: targets[1].interval: ...`)
so a bad deploy is fixed in one look. Unknown keys are errors: a typo must not be ignored.
CLI flags build the same `Config` (`from_flags`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import yaml

from exporter.engines import ENGINE_KINDS
from exporter.windows import DEFAULT_WINDOWS, Window, parse_window

DEFAULT_LISTEN = ("0.0.0.0", 10419)
DEFAULT_INTERVAL = 1.0
DEFAULT_TIMEOUT = 2.0

T = TypeVar("T")


class ConfigError(Exception):
    """A configuration error, located: `file:line: key: message`."""

    def __init__(self, source: str, line: int | None, key: str, message: str) -> None:
        where = source if line is None else f"{source}:{line}"
        super().__init__(f"{where}: {key}: {message}" if key else f"{where}: {message}")


@dataclass(frozen=True, slots=True)
class Target:
    """A /metrics endpoint to scrape."""

    name: str
    url: str
    engine: str = "vllm"
    prefix: str | None = None
    interval: float = DEFAULT_INTERVAL
    timeout: float = DEFAULT_TIMEOUT


@dataclass(frozen=True, slots=True)
class Config:
    listen: tuple[str, int]
    targets: tuple[Target, ...]
    windows: tuple[Window, ...] = DEFAULT_WINDOWS


def load(path: str | Path) -> Config:
    """Read and validate a YAML config file; ConfigError on any problem."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(source, None, "", f"cannot read: {exc}") from exc
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = None if mark is None else mark.line + 1
        raise ConfigError(
            source, line, "", f"not valid YAML: {getattr(exc, 'problem', exc)}"
        ) from exc
    if root is None:
        raise ConfigError(source, 1, "", "the file is empty; it needs at least `targets:`")
    return _Reader(source).config(root)


def from_flags(
    targets: list[str], listen: str | None, interval: float, windows: list[str] | None
) -> Config:
    """The zero-config form: `--target URL` (repeatable), `--listen`, `--interval`, `--window`."""
    reader = _Reader("command line")
    parsed = []
    for i, url in enumerate(targets):
        reader.check_url(url, None, f"--target[{i}]")
        parsed.append(Target(name=default_name(url), url=url, interval=interval))
    names = [t.name for t in parsed]
    if len(set(names)) != len(names):
        raise ConfigError("command line", None, "--target", "the same host:port is given twice")
    if interval <= 0:
        raise ConfigError("command line", None, "--interval", "must be greater than zero")
    return Config(
        listen=DEFAULT_LISTEN
        if listen is None
        else reader.listen_address(listen, None, "--listen"),
        targets=tuple(parsed),
        windows=tuple(reader.window(w, None, "--window") for w in windows or []) or DEFAULT_WINDOWS,
    )


def default_name(url: str) -> str:
    """A target's name when none is given: its host:port."""
    parts = urlsplit(url)
    return parts.netloc.rsplit("@", 1)[-1] or url


def redact(url: str) -> str:
    """A URL fit for logs and pages: no user:password, no query string (it may hold a token)."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return f"{parts.scheme}://{host}{parts.path}" + ("?..." if parts.query else "")


class _Reader:
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
        value = self.scalar(node, key, _seconds, "a duration such as 1, 2.5, 500ms or 10s")
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

    def config(self, root: yaml.Node) -> Config:
        top = self.mapping(root, "", ("listen", "targets", "windows"), required=("targets",))
        listen = DEFAULT_LISTEN
        if "listen" in top:
            text = self.scalar(top["listen"], "listen", str, "HOST:PORT")
            listen = self.listen_address(text, top["listen"], "listen")
        windows = DEFAULT_WINDOWS
        if "windows" in top:
            windows = self.windows(top["windows"])
        seq = top["targets"]
        if not isinstance(seq, yaml.SequenceNode) or not seq.value:
            raise self.fail(seq, "targets", "expected a non-empty list of targets")
        targets = tuple(self.target(n, f"targets[{i}]") for i, n in enumerate(seq.value))
        seen: dict[str, int] = {}
        for i, t in enumerate(targets):
            if t.name in seen:
                raise self.fail(
                    seq.value[i],
                    f"targets[{i}].name",
                    f"{t.name!r} is also targets[{seen[t.name]}]",
                )
            seen[t.name] = i
        return Config(listen=listen, targets=targets, windows=windows)

    def windows(self, node: yaml.Node) -> tuple[Window, ...]:
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            raise self.fail(node, "windows", "expected a non-empty list such as [1m, 5m, 15m]")
        result = []
        for i, item in enumerate(node.value):
            text = self.scalar(item, f"windows[{i}]", str, "a duration such as 5m")
            result.append(self.window(text, item, f"windows[{i}]"))
        if len({w.seconds for w in result}) != len(result):
            raise self.fail(node, "windows", "the same window is given twice")
        return tuple(result)

    def target(self, node: yaml.Node, key: str) -> Target:
        fields = ("name", "url", "engine", "prefix", "interval", "timeout")
        m = self.mapping(node, key, fields, required=("url",))
        url = self.check_url(
            self.scalar(m["url"], f"{key}.url", str, "a URL"), m["url"], f"{key}.url"
        )
        engine = "vllm"
        if "engine" in m:
            engine = self.scalar(m["engine"], f"{key}.engine", str, "an engine kind")
            if engine not in ENGINE_KINDS:
                raise self.fail(
                    m["engine"],
                    f"{key}.engine",
                    f"expected one of {', '.join(ENGINE_KINDS)}, got {engine!r}",
                )
        name = default_name(url)
        if "name" in m:
            name = self.scalar(m["name"], f"{key}.name", str, "a name")
            if not all(c.isalnum() or c in "_.:-" for c in name):
                raise self.fail(
                    m["name"], f"{key}.name", f"use letters, digits and _.:- only, got {name!r}"
                )
        prefix = (
            self.scalar(m["prefix"], f"{key}.prefix", str, "a metric prefix such as vllm:")
            if "prefix" in m
            else None
        )
        interval = (
            self.seconds(m["interval"], f"{key}.interval") if "interval" in m else DEFAULT_INTERVAL
        )
        timeout = (
            self.seconds(m["timeout"], f"{key}.timeout") if "timeout" in m else DEFAULT_TIMEOUT
        )
        return Target(name, url, engine, prefix, interval, timeout)


def _seconds(text: str) -> float:
    """'2', '2.5', '500ms', '10s', '1m' -> seconds."""
    for suffix, scale in (("ms", 0.001), ("s", 1.0), ("m", 60.0)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * scale
    return float(text)
