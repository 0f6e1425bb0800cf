"""The sidecar's configuration: one YAML file -> typed, validated dataclasses.

Every error names the file, the line and the key (`specdec.yaml:7: targets[1].interval: ...`)
so a bad deploy is fixed in one look. Unknown keys are errors: a typo must not be ignored.
CLI flags build the same `Config` (`from_flags`).
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from exporter.config.nodes import ConfigError, Reader
from exporter.core.windows import DEFAULT_WINDOWS, Window

__all__ = ["Config", "ConfigError", "ModelConfig", "ProxyConfig", "Route", "Target", "load"]

DEFAULT_LISTEN = ("0.0.0.0", 10419)
DEFAULT_PROXY_LISTEN = ("127.0.0.1", 8001)
DEFAULT_INTERVAL = 1.0
DEFAULT_TIMEOUT = 2.0
DEFAULT_MAX_BODY = 16 * 1024 * 1024
ENGINE_KINDS = ("vllm", "llamacpp", "trtllm")  # `engine:` of a target: whose counter names
CONDITIONS = ("header", "path_prefix", "model", "user", "api_key_sha256_prefix")


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
class Route:
    """A named route and the conditions a request must all meet to take it."""

    name: str
    headers: tuple[tuple[str, str], ...] = ()  # (lower-case name, exact value)
    path_prefix: str | None = None
    model: str | None = None
    user: str | None = None
    api_key_sha256_prefix: str | None = None


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    upstream: str
    listen: tuple[str, int] = DEFAULT_PROXY_LISTEN
    target: str | None = None
    routes: tuple[Route, ...] = ()
    default_route: str = "other"
    max_body_bytes: int = DEFAULT_MAX_BODY
    connect_timeout: float = 5.0
    read_timeout: float = 600.0

    @property
    def route_names(self) -> tuple[str, ...]:
        """Every value the `route` label can take: the configured names, nothing else."""
        return tuple(dict.fromkeys([*(r.name for r in self.routes), self.default_route]))


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """What the payoff figures need to know about a served model."""

    name: str
    num_speculative_tokens: int
    step_cost_ratio: float
    plain_decode_tokens_per_second: float | None = None
    bytes_per_token: float | None = None
    memory_bandwidth_bytes_per_second: float | None = None


@dataclass(frozen=True, slots=True)
class Config:
    listen: tuple[str, int]
    targets: tuple[Target, ...]
    windows: tuple[Window, ...] = DEFAULT_WINDOWS
    proxy: ProxyConfig | None = None
    models: tuple[ModelConfig, ...] = field(default=())


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
        message = f"not valid YAML: {getattr(exc, 'problem', exc)}"
        raise ConfigError(source, line, "", message) from exc
    if root is None:
        raise ConfigError(source, 1, "", "the file is empty; it needs at least `targets:`")
    return _ConfigReader(source).config(root)


def from_flags(
    targets: list[str], listen: str | None, interval: float, windows: list[str] | None
) -> Config:
    """The zero-config form: `--target URL` (repeatable), `--listen`, `--interval`, `--window`."""
    reader = Reader("command line")
    parsed = []
    for i, url in enumerate(targets):
        reader.check_url(url, None, f"--target[{i}]")
        parsed.append(Target(name=default_name(url), url=url, interval=interval))
    names = [t.name for t in parsed]
    if len(set(names)) != len(names):
        raise ConfigError("command line", None, "--target", "the same host:port is given twice")
    if not 0 < interval <= 3600:
        raise ConfigError("command line", None, "--interval", "must be between 0 and 3600 seconds")
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


class _ConfigReader(Reader):
    def config(self, root: yaml.Node) -> Config:
        allowed = ("listen", "targets", "windows", "proxy", "models")
        top = self.mapping(root, "", allowed, required=("targets",))
        listen = DEFAULT_LISTEN
        if "listen" in top:
            text = self.scalar(top["listen"], "listen", str, "HOST:PORT")
            listen = self.listen_address(text, top["listen"], "listen")
        windows = self.windows(top["windows"]) if "windows" in top else DEFAULT_WINDOWS
        seq = top["targets"]
        if not isinstance(seq, yaml.SequenceNode) or not seq.value:
            raise self.fail(seq, "targets", "expected a non-empty list of targets")
        targets = tuple(self.target(n, f"targets[{i}]") for i, n in enumerate(seq.value))
        self.unique([t.name for t in targets], seq.value, "targets", "name")
        proxy = self.proxy(top["proxy"], targets) if "proxy" in top else None
        models: tuple[ModelConfig, ...] = ()
        if "models" in top:
            nodes = self.sequence(top["models"], "models")
            models = tuple(self.model(n, f"models[{i}]") for i, n in enumerate(nodes))
            self.unique([m.name for m in models], nodes, "models", "name")
        return Config(listen, targets, windows, proxy, models)

    def unique(self, names: list[str], nodes: list[yaml.Node], key: str, field: str) -> None:
        seen: dict[str, int] = {}
        for i, name in enumerate(names):
            if name in seen:
                raise self.fail(
                    nodes[i], f"{key}[{i}].{field}", f"{name!r} is also {key}[{seen[name]}]"
                )
            seen[name] = i

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
                kinds = ", ".join(ENGINE_KINDS)
                raise self.fail(
                    m["engine"], f"{key}.engine", f"expected one of {kinds}, got {engine!r}"
                )
        name = self.name(m["name"], f"{key}.name") if "name" in m else default_name(url)
        prefix = None
        if "prefix" in m:
            prefix = self.scalar(m["prefix"], f"{key}.prefix", str, "a metric prefix such as vllm:")
            if not all(c in string.ascii_letters + string.digits + "_:" for c in prefix):
                raise self.fail(
                    m["prefix"], f"{key}.prefix", f"not a metric name prefix: {prefix!r}"
                )
        interval = (
            self.seconds(m["interval"], f"{key}.interval") if "interval" in m else DEFAULT_INTERVAL
        )
        timeout = (
            self.seconds(m["timeout"], f"{key}.timeout") if "timeout" in m else DEFAULT_TIMEOUT
        )
        return Target(name, url, engine, prefix, interval, timeout)

    def proxy(self, node: yaml.Node, targets: tuple[Target, ...]) -> ProxyConfig:
        fields = (
            "listen",
            "upstream",
            "target",
            "routes",
            "default_route",
            "max_body_bytes",
            "connect_timeout",
            "read_timeout",
        )
        m = self.mapping(node, "proxy", fields, required=("upstream",))
        upstream = self.scalar(m["upstream"], "proxy.upstream", str, "a URL")
        parts = urlsplit(self.check_url(upstream, m["upstream"], "proxy.upstream"))
        if parts.path not in ("", "/") or parts.query or parts.username:
            raise self.fail(m["upstream"], "proxy.upstream", "expected http(s)://HOST:PORT only")
        config = ProxyConfig(upstream=f"{parts.scheme}://{parts.netloc}")
        listen = config.listen
        if "listen" in m:
            text = self.scalar(m["listen"], "proxy.listen", str, "HOST:PORT")
            listen = self.listen_address(text, m["listen"], "proxy.listen")
        target = None
        if "target" in m:
            target = self.name(m["target"], "proxy.target")
            if target not in {t.name for t in targets}:
                raise self.fail(m["target"], "proxy.target", f"no target is named {target!r}")
        routes: tuple[Route, ...] = ()
        if "routes" in m:
            nodes = self.sequence(m["routes"], "proxy.routes")
            routes = tuple(self.route(n, f"proxy.routes[{i}]") for i, n in enumerate(nodes))
            self.unique([r.name for r in routes], nodes, "proxy.routes", "name")
        default = (
            self.name(m["default_route"], "proxy.default_route")
            if "default_route" in m
            else "other"
        )
        max_body = config.max_body_bytes
        if "max_body_bytes" in m:
            max_body = int(self.number(m["max_body_bytes"], "proxy.max_body_bytes", 1024, 1 << 30))
        connect = (
            self.seconds(m["connect_timeout"], "proxy.connect_timeout")
            if "connect_timeout" in m
            else 5.0
        )
        read = (
            self.seconds(m["read_timeout"], "proxy.read_timeout") if "read_timeout" in m else 600.0
        )
        return ProxyConfig(
            config.upstream, listen, target, routes, default, max_body, connect, read
        )

    def route(self, node: yaml.Node, key: str) -> Route:
        m = self.mapping(node, key, ("name", "when"), required=("name", "when"))
        name = self.name(m["name"], f"{key}.name")
        when = self.mapping(m["when"], f"{key}.when", CONDITIONS)
        if not when:
            raise self.fail(
                m["when"], f"{key}.when", f"give at least one of {', '.join(CONDITIONS)}"
            )
        headers: list[tuple[str, str]] = []
        if "header" in when:
            node_h = when["header"]
            if not isinstance(node_h, yaml.MappingNode) or not node_h.value:
                raise self.fail(
                    node_h, f"{key}.when.header", "expected a mapping of Header-Name: value"
                )
            for k, v in node_h.value:
                header = self.scalar(k, f"{key}.when.header", str, "a header name")
                headers.append(
                    (header.lower(), self.scalar(v, f"{key}.when.header.{header}", str, "a value"))
                )
        text = {
            c: self.scalar(when[c], f"{key}.when.{c}", str, "a string")
            for c in CONDITIONS[1:]
            if c in when
        }
        prefix = text.get("path_prefix")
        if prefix is not None and (
            not prefix.startswith("/") or prefix.endswith("/") or len(prefix) < 2
        ):
            raise self.fail(
                when["path_prefix"], f"{key}.when.path_prefix", f"expected /SEGMENT, got {prefix!r}"
            )
        key_prefix = text.get("api_key_sha256_prefix")
        if key_prefix is not None and (
            len(key_prefix) < 8 or not all(c in string.hexdigits for c in key_prefix)
        ):
            raise self.fail(
                when["api_key_sha256_prefix"],
                f"{key}.when.api_key_sha256_prefix",
                "expected at least 8 hex digits of the key's sha256",
            )
        return Route(
            name,
            tuple(headers),
            prefix,
            text.get("model"),
            text.get("user"),
            None if key_prefix is None else key_prefix.lower(),
        )

    def model(self, node: yaml.Node, key: str) -> ModelConfig:
        fields = (
            "name",
            "num_speculative_tokens",
            "step_cost_ratio",
            "plain_decode_tokens_per_second",
            "bytes_per_token",
            "memory_bandwidth_bytes_per_second",
        )
        m = self.mapping(
            node, key, fields, required=("name", "num_speculative_tokens", "step_cost_ratio")
        )
        name = self.scalar(m["name"], f"{key}.name", str, "the model_name vLLM reports")
        k = self.number(m["num_speculative_tokens"], f"{key}.num_speculative_tokens", 1, 64)
        if k != int(k):
            raise self.fail(
                m["num_speculative_tokens"],
                f"{key}.num_speculative_tokens",
                "expected a whole number",
            )
        cost = self.number(m["step_cost_ratio"], f"{key}.step_cost_ratio", 1.0, 100.0)
        optional = {f: self.number(m[f], f"{key}.{f}", 1e-9, 1e18) for f in fields[3:] if f in m}
        return ModelConfig(name, int(k), cost, **optional)
