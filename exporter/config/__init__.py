"""The sidecar's configuration: one YAML file -> typed, validated dataclasses (schema.py).

Every error names the file, the line and the key (`specdec.yaml:7: targets[1].interval: ...`)
so a bad deploy is fixed in one look, and a file with several errors reports them all, in the
file's order. Values tagged `!placeholder` load, and are named (`load_with_placeholders`).
Unknown keys are errors: a typo must not be ignored. CLI flags build the same `Config`
(`from_flags`).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import yaml

from exporter.config.nodes import INVALID, ConfigError, Placeholder, compose, placeholders
from exporter.config.schema import (
    DEFAULT_INTERVAL,
    DEFAULT_KIND,
    DEFAULT_LISTEN,
    DEFAULT_TIMEOUT,
    Breakdown,
    Config,
    ConfigReader,
    ModelConfig,
    ProxyConfig,
    RequestLogConfig,
    Route,
    StepTimePoint,
    Target,
    as_read,
    child,
    default_name,
    metrics_url,
    read,
)
from exporter.core.windows import DEFAULT_WINDOWS

__all__ = [
    "DEFAULT_INTERVAL",
    "DEFAULT_KIND",
    "DEFAULT_LISTEN",
    "DEFAULT_TIMEOUT",
    "Breakdown",
    "Config",
    "ConfigError",
    "ModelConfig",
    "Placeholder",
    "ProxyConfig",
    "RequestLogConfig",
    "Route",
    "StepTimePoint",
    "Target",
    "default_name",
    "from_flags",
    "load",
    "load_with_placeholders",
    "redact",
]


def load(path: str | Path) -> Config:
    """Read and validate a YAML config file; ConfigError (every error in it) on any problem."""
    return load_with_placeholders(path)[0]


def load_with_placeholders(path: str | Path) -> tuple[Config, tuple[Placeholder, ...]]:
    """`load`, and the values the file tags `!placeholder` (`specdec serve --check` names
    them): ConfigError with every error of the file, in its order, in one run."""
    source = str(path)
    root = compose(path)
    if root is None:
        raise ConfigError(source, 1, "", "the file is empty; it needs at least `targets:`")
    reader = ConfigReader(source)
    config = read(reader, Config, root, "")
    _check_intervals(reader, root)
    reader.raise_errors()
    return config, tuple(placeholders(source, root))


def _check_intervals(reader: ConfigReader, root: yaml.Node) -> None:
    """Each target's interval against the shortest window, wherever both were read (the rest
    of the file may have errors: they are all reported together)."""
    if not isinstance(root, yaml.MappingNode):
        return
    windows = as_read(reader, Config, root, "", "windows")
    targets = child(root, "targets")
    if windows is INVALID or not isinstance(targets, yaml.SequenceNode):
        return
    shortest = min(w.seconds for w in windows)
    for i, node in enumerate(targets.value):
        interval = as_read(reader, Target, node, f"targets[{i}]", "interval")
        if interval is not INVALID and interval >= shortest:
            key = f"targets[{i}].interval"
            message = _interval_message(interval, shortest)
            reader.errors.append(reader.fail(child(node, "interval"), key, message))


def _interval_message(interval: float, shortest: float) -> str:
    """A scrape interval as long as a window would make that window's figure span one scrape,
    or none: every window must hold several."""
    return (
        f"{interval:g}s is not shorter than the shortest window ({shortest:g}s): the window "
        "would span a single scrape or none; scrape more often or widen `windows`"
    )


def from_flags(
    targets: list[str], listen: str | None, interval: float, windows: list[str] | None
) -> Config:
    """The zero-config form: `--target URL` (repeatable), `--listen`, `--interval`, `--window`."""
    reader = ConfigReader("command line")
    parsed = []
    for i, given in enumerate(targets):
        url = metrics_url(reader.check_url(given, None, f"--target[{i}]"))
        parsed.append(Target(name=default_name(url), url=url, interval=interval))
    names = [t.name for t in parsed]
    if len(set(names)) != len(names):
        raise ConfigError("command line", None, "--target", "the same host:port is given twice")
    chosen = tuple(reader.window(w, None, "--window") for w in windows or []) or DEFAULT_WINDOWS
    if interval >= min(w.seconds for w in chosen):
        shortest = min(w.seconds for w in chosen)
        raise ConfigError("command line", None, "--interval", _interval_message(interval, shortest))
    if not 0 < interval <= 3600:
        raise ConfigError(
            "command line",
            None,
            "--interval",
            f"must be more than 0 and at most 1h, got {interval:g}",
        )
    return Config(
        listen=DEFAULT_LISTEN
        if listen is None
        else reader.listen_address(listen, None, "--listen"),
        targets=tuple(parsed),
        windows=chosen,
    )


def redact(url: str) -> str:
    """A URL fit for logs and pages: no user:password, no query string (it may hold a token)."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return f"{parts.scheme}://{host}{parts.path}" + ("?..." if parts.query else "")
