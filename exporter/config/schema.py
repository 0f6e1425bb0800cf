"""The sidecar's configuration as typed dataclasses. Each field declares, once, its YAML key
(the field name unless `key` says otherwise), its default (the dataclass default) and its
check; `read` derives the allowed and required keys of every mapping from them."""

from __future__ import annotations

import string
from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import urlsplit, urlunsplit

import yaml

from exporter.config.nodes import (
    INVALID,
    Check,
    Reader,
    described,
    metric_prefix,
    number,
    one_of,
    whole,
)
from exporter.core.payoff import StepCurve, StepPoint, single_point_curve
from exporter.core.schedule import BadSchedule, Schedule, draft_length_at
from exporter.core.windows import DEFAULT_WINDOWS, Window, parse_window
from exporter.engines import DEFAULT_KIND as DEFAULT_KIND  # a target naming no engine: re-exported
from exporter.engines import KINDS

DEFAULT_LISTEN = ("0.0.0.0", 10419)
DEFAULT_PROXY_LISTEN = ("127.0.0.1", 8001)
DEFAULT_INTERVAL = 1.0
DEFAULT_TIMEOUT = 2.0
DEFAULT_MAX_BODY = 16 * 1024 * 1024
DEFAULT_MAX_BUFFERED = 64 * 1024 * 1024  # fits the shipped 256Mi pod limit (docs/operations.md)
if TYPE_CHECKING:
    from _typeshed import DataclassInstance
C = TypeVar("C", bound="DataclassInstance")


def setting(
    check: Check,
    default: Any = MISSING,
    *,
    key: str | None = None,
    group: str = "",
    fallback: Callable[[dict[str, Any]], Any] | None = None,
    required: bool | None = None,
) -> Any:
    """A config field: `check` reads its YAML node. `group` nests it under another key (a
    route's conditions under `when`). `fallback` computes a value the YAML may leave out from
    the others (a target's name from its URL). `required` (default: no default and no
    fallback) says whether a config file must give it."""
    if required is None:
        required = default is MISSING and fallback is None
    meta = {"check": check, "key": key, "group": group, "fallback": fallback, "required": required}
    return field(default=default, metadata=meta)


class ConfigReader(Reader):
    """A reader that remembers the target names, for the proxy's `target:` (None while they
    are not known: `targets:` missing or wrong, an error already said)."""

    target_names: tuple[str, ...] | None = None


# --- the dataclasses --------------------------------------------------------------------------


def _target_name(r: Reader, node: yaml.Node, key: str) -> str:
    return r.name(node, key)


def metrics_url(url: str) -> str:
    """A target's URL: one without a path (http://host:8000) means the server's /metrics."""
    parts = urlsplit(url)
    if parts.path in ("", "/"):
        return urlunsplit(parts._replace(path="/metrics"))
    return url


def _target_url(r: Reader, node: yaml.Node, key: str) -> str:
    return metrics_url(r.url(node, key))


@dataclass(frozen=True, slots=True)
class Target:
    """A /metrics endpoint to scrape."""

    name: str = setting(_target_name, fallback=lambda v: default_name(v["url"]))
    url: str = setting(_target_url)
    # the engine's kind (`engine:` in the YAML): `scrape.target.TargetState.engine` is the engine
    kind: str = setting(one_of(KINDS, "an engine kind"), DEFAULT_KIND, key="engine")
    prefix: str | None = setting(metric_prefix, None)
    interval: float = setting(Reader.seconds, DEFAULT_INTERVAL)
    timeout: float = setting(Reader.seconds, DEFAULT_TIMEOUT)
    # the model_name of series whose page carries none (llama.cpp's server: one model each);
    # default: the one model of `models:` when it names exactly one
    model_name: str | None = setting(described("the served model's name"), None)


def _headers(r: Reader, node: yaml.Node, key: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(node, yaml.MappingNode) or not node.value:
        raise r.fail(node, key, "expected a mapping of Header-Name: value")
    headers = []
    for k, v in node.value:
        header = r.scalar(k, key, str, "a header name")
        headers.append((header.lower(), r.scalar(v, f"{key}.{header}", str, "a value")))
    return tuple(headers)


def _path_prefix(r: Reader, node: yaml.Node, key: str) -> str:
    prefix = r.text(node, key)
    if not prefix.startswith("/") or prefix.endswith("/") or len(prefix) < 2:
        raise r.fail(node, key, f"expected /SEGMENT, got {prefix!r}")
    return prefix


def _key_prefix(r: Reader, node: yaml.Node, key: str) -> str:
    prefix = r.text(node, key)
    if len(prefix) < 8 or not all(c in string.hexdigits for c in prefix):
        raise r.fail(node, key, "expected at least 8 hex digits of the key's sha256")
    return prefix.lower()


@dataclass(frozen=True, slots=True)
class Route:
    """A named route and the conditions a request must all meet to take it."""

    name: str = setting(Reader.name)
    headers: tuple[tuple[str, str], ...] = setting(_headers, (), key="header", group="when")
    path_prefix: str | None = setting(_path_prefix, None, group="when")
    model: str | None = setting(Reader.text, None, group="when")
    user: str | None = setting(Reader.text, None, group="when")
    api_key_sha256_prefix: str | None = setting(_key_prefix, None, group="when")


def _upstream(r: Reader, node: yaml.Node, key: str) -> str:
    parts = urlsplit(r.url(node, key))
    if parts.path not in ("", "/") or parts.query or parts.username:
        raise r.fail(node, key, "expected http(s)://HOST:PORT only")
    return f"{parts.scheme}://{parts.netloc}"


def _fronted(r: Reader, node: yaml.Node, key: str) -> str:
    name = r.name(node, key)
    known = r.target_names if isinstance(r, ConfigReader) else None
    if known is not None and name not in known:
        raise r.fail(node, key, f"no target is named {name!r}")
    return name


def objects(cls: type[C], what: str = "a non-empty list", unique: str = "name") -> Check:
    """A non-empty list of `cls` mappings whose `unique` field differs from item to item."""

    def check(r: Reader, node: yaml.Node, key: str) -> tuple[C, ...]:
        items = r.sequence(node, key, what)
        read_items = [(i, n, read(r, cls, n, f"{key}[{i}]")) for i, n in enumerate(items)]
        out: list[C] = []
        seen: dict[str, int] = {}
        for i, item_node, item in read_items:
            if item is INVALID:
                continue
            value = getattr(item, unique)
            if value in seen:
                r.errors.append(
                    r.fail(
                        item_node, f"{key}[{i}].{unique}", f"{value!r} is also {key}[{seen[value]}]"
                    )
                )
            seen.setdefault(value, i)
            out.append(item)
        return tuple(out)

    return check


def _flag(r: Reader, node: yaml.Node, key: str) -> bool:
    value = r.scalar(node, key, str, "true or false")
    if value not in ("true", "false"):
        raise r.fail(node, key, f"expected true or false, got {value!r}")
    return value == "true"


@dataclass(frozen=True, slots=True)
class RequestLogConfig:
    """One JSON line per completion through the proxy, off by default: every failed,
    low-acceptance or slow request, and a `sample` of the rest (`exporter/proxy/requestlog.py`)."""

    enabled: bool = setting(_flag, False)
    sample: float = setting(number(0.0, 1.0), 0.01)  # the share of the other requests logged
    low_acceptance: float = setting(number(0.0, 1.0), 0.3)  # below it: always logged
    slow_ttft: float = setting(Reader.seconds, 2.0)  # past it (TTFT, else the whole request)


def _request_log(r: Reader, node: yaml.Node, key: str) -> RequestLogConfig:
    return read(r, RequestLogConfig, node, key)


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    upstream: str = setting(_upstream)
    listen: tuple[str, int] = setting(Reader.listen, DEFAULT_PROXY_LISTEN)
    target: str | None = setting(_fronted, None)
    routes: tuple[Route, ...] = setting(objects(Route), ())
    default_route: str = setting(Reader.name, "other")
    max_body_bytes: int = setting(whole(1024, 1 << 30), DEFAULT_MAX_BODY)
    # every body and event held at once, over all connections: past it, 503 + Retry-After
    max_buffered_bytes: int = setting(whole(1024, 1 << 40), DEFAULT_MAX_BUFFERED)
    connect_timeout: float = setting(Reader.seconds, 5.0)
    read_timeout: float = setting(Reader.seconds, 600.0)
    # a stop signal: in-flight requests get this long to complete, then are cut (and counted)
    drain_timeout: float = setting(Reader.seconds, 30.0)
    max_connections: int = setting(whole(1, 1_000_000), 1024)  # client connections at once
    max_in_flight: int = setting(whole(1, 1_000_000), 512)  # requests upstream at once
    header_timeout: float = setting(Reader.seconds, 10.0)  # first byte -> a request's whole head
    body_timeout: float = setting(Reader.seconds, 60.0)  # the whole head -> the whole body
    write_timeout: float = setting(Reader.seconds, 30.0)  # a client not reading -> cut
    idle_timeout: float = setting(Reader.seconds, 75.0)  # keep-alive: no request under way
    # the upstream's kind (`engine:`), when no target says it (default: the fronted target's)
    kind: str | None = setting(one_of(KINDS, "an engine kind"), None, key="engine")
    request_log: RequestLogConfig = setting(_request_log, RequestLogConfig())

    @property
    def route_names(self) -> tuple[str, ...]:
        """Every value the `route` label can take: the configured names, nothing else."""
        return tuple(dict.fromkeys([*(r.name for r in self.routes), self.default_route]))


_POSITIVE = number(1e-9, 1e18)


def _draft_seconds(r: Reader, node: yaml.Node, key: str) -> tuple[tuple[int, float], ...]:
    """{draft length: seconds per verify step}, as `specdec measure` prints it."""
    if not isinstance(node, yaml.MappingNode) or not node.value:
        raise r.fail(node, key, "expected a mapping of draft lengths to seconds, {1: 0.0085}")
    found = {}
    for k_node, v_node in node.value:
        length = whole(1, 64)(r, k_node, key)
        if length in found:
            raise r.fail(k_node, key, f"draft length {length} given twice")
        found[length] = _POSITIVE(r, v_node, f"{key}[{length}]")
    return tuple(sorted(found.items()))


@dataclass(frozen=True, slots=True)
class StepTimePoint:
    """One measured point of the step-time curve (`specdec measure --concurrency` prints them)."""

    running: float = setting(number(0.0, 1e6))
    plain_seconds: float = setting(_POSITIVE)
    verify_seconds: float | None = setting(_POSITIVE, None)
    # verify steps at draft lengths below k, {length: seconds}: engines with a per-request k
    draft_seconds: tuple[tuple[int, float], ...] = setting(_draft_seconds, ())
    # draft tokens per decode step of the verify phase where below k (a schedule's range)
    verify_drafts: float | None = setting(number(0.0, 64.0), None)
    # tokens a running request held in its KV over the point's phases, and what a step gains
    # per token more of it (measure at two context lengths)
    context_tokens: float | None = setting(number(0.0, 1e9), None)
    plain_seconds_per_context_token: float = setting(number(0.0, 1.0), 0.0)
    verify_seconds_per_context_token: float = setting(number(0.0, 1.0), 0.0)
    # measure's error over its whole run, as a share of the step (`specdec measure`'s spread:
    # its farthest replicate): how far the live step may drift from the curve unnoticed
    plain_spread: float | None = setting(number(0.0, 10.0), None)
    verify_spread: float | None = setting(number(0.0, 10.0), None)


def _schedule(r: Reader, node: yaml.Node, key: str) -> Schedule:
    """vLLM's `num_speculative_tokens_per_batch_size`, as `advise` prints it."""
    shape = "vLLM's num_speculative_tokens_per_batch_size, a list of [start, end, k]"
    if not isinstance(node, yaml.SequenceNode):
        raise r.fail(node, key, f"expected {shape}")
    ranges = []
    for item in node.value:
        if not isinstance(item, yaml.SequenceNode):
            raise r.fail(item, key, f"expected {shape}")
        ranges.append([r.scalar(v, key, int, "a whole number") for v in item.value])
    try:
        return Schedule.parse(ranges)
    except BadSchedule as exc:
        raise r.fail(node, key, str(exc)) from None


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """What the payoff figures need to know about a served model."""

    name: str = setting(described("the model_name vLLM reports"))
    num_speculative_tokens: int = setting(whole(1, 64))  # the draft length k, as vLLM names it
    step_cost_ratio: float = setting(number(1.0, 100.0))
    plain_decode_tokens_per_second: float | None = setting(_POSITIVE, None)
    bytes_per_token: float | None = setting(_POSITIVE, None)
    memory_bandwidth_bytes_per_second: float | None = setting(_POSITIVE, None)
    step_time: tuple[StepTimePoint, ...] = setting(
        objects(StepTimePoint, "a non-empty list of step-time points", unique="running"), ()
    )
    # the dynamic speculative decoding schedule the engine runs (k by batch), if it runs one
    draft_length_schedule: Schedule | None = setting(_schedule, None)

    def scheduled_draft_length(self, batch: float) -> int:
        """The draft length the engine runs at `batch`: the schedule's (at most the model's k),
        else the model's k."""
        return draft_length_at(self.draft_length_schedule, self.num_speculative_tokens, batch)

    @property
    def curve(self) -> StepCurve | None:
        """Step seconds against the batch: the measured curve, else the single-stream point
        (plain rate and step cost), else None (no plain rate: no speedup can be stated)."""
        if self.step_time:
            return StepCurve(
                tuple(
                    StepPoint(
                        p.running,
                        p.plain_seconds,
                        p.verify_seconds,
                        p.draft_seconds,
                        p.verify_drafts,
                        p.context_tokens,
                        p.plain_seconds_per_context_token,
                        p.verify_seconds_per_context_token,
                        p.plain_spread,
                        p.verify_spread,
                    )
                    for p in self.step_time
                ),
                self.num_speculative_tokens,
                self.draft_length_schedule,
            )
        if self.plain_decode_tokens_per_second:
            rate = self.plain_decode_tokens_per_second
            curve = single_point_curve(self.step_cost_ratio, rate, self.num_speculative_tokens)
            return replace(curve, schedule=self.draft_length_schedule)
        return None


def _targets(r: Reader, node: yaml.Node, key: str) -> tuple[Target, ...]:
    before = len(r.errors)
    targets: tuple[Target, ...] = objects(Target, "a non-empty list of targets")(r, node, key)
    if isinstance(r, ConfigReader) and len(r.errors) == before:
        r.target_names = tuple(t.name for t in targets)
    return targets


def _proxy(r: Reader, node: yaml.Node, key: str) -> ProxyConfig:
    proxy = read(r, ProxyConfig, node, key)
    body = as_read(r, ProxyConfig, node, key, "max_body_bytes")
    held = as_read(r, ProxyConfig, node, key, "max_buffered_bytes")
    if body is not INVALID and held is not INVALID and held < body:
        raise r.fail(
            child(node, "max_buffered_bytes"),
            f"{key}.max_buffered_bytes",
            f"must be at least max_body_bytes ({body}): a body of that size could never be held",
        )
    return proxy


def child(node: yaml.Node, name: str) -> yaml.Node:
    """The value node of `name` in a mapping node (the mapping itself when it is not there)."""
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == name:
                return cast(yaml.Node, v)
    return node


def _window(r: Reader, node: yaml.Node, key: str) -> Window:
    return r.window(r.scalar(node, key, str, "a duration such as 10m"), node, key)


@dataclass(frozen=True, slots=True)
class Breakdown:
    """A route's acceptance change split into traffic mix and within-band parts: over `window`
    against the `baseline` before it (`specdec_route_acceptance_change_ratio`; defaults as the
    drop alert's longer window and its baseline)."""

    window: Window = setting(_window, parse_window("10m"))
    baseline: Window = setting(_window, parse_window("1d"))


def _breakdown(r: Reader, node: yaml.Node, key: str) -> Breakdown:
    found = read(r, Breakdown, node, key)
    window = as_read(r, Breakdown, node, key, "window")
    baseline = as_read(r, Breakdown, node, key, "baseline")
    if window is not INVALID and baseline is not INVALID and baseline.seconds <= window.seconds:
        raise r.fail(
            child(node, "baseline"),
            f"{key}.baseline",
            f"must be longer than the window ({window.label}): the change is the window "
            "against what the baseline holds",
        )
    return found


@dataclass(frozen=True, slots=True)
class Config:
    listen: tuple[str, int] = setting(Reader.listen, DEFAULT_LISTEN)
    targets: tuple[Target, ...] = setting(_targets, (), required=True)
    windows: tuple[Window, ...] = setting(Reader.windows, DEFAULT_WINDOWS)
    proxy: ProxyConfig | None = setting(_proxy, None)
    models: tuple[ModelConfig, ...] = setting(objects(ModelConfig), ())
    breakdown: Breakdown = setting(_breakdown, Breakdown())


# --- reading a mapping into a dataclass ----------------------------------------------------


def yaml_key(f: Field[Any]) -> str:
    return str(f.metadata["key"] or f.name)


def keys(cls: type, group: str = "") -> tuple[str, ...]:
    """The YAML keys of `cls` at one level: its own fields' and its groups' (or a group's)."""
    out: list[str] = []
    for f in fields(cls):
        own = f.metadata["group"]
        key = yaml_key(f) if own == group else (own if not group else "")
        if key and key not in out:
            out.append(key)
    return tuple(out)


def _groups(cls: type) -> tuple[str, ...]:
    return tuple(dict.fromkeys(g for f in fields(cls) if (g := f.metadata["group"])))


def _mapping(cls: type, group: str) -> Check:
    """The check of one level of a `cls` mapping: the whole object, or one of its groups
    (which must give at least one of its keys)."""

    def check(r: Reader, node: yaml.Node, key: str) -> dict[str, yaml.Node]:
        if not group:
            own = tuple(yaml_key(f) for f in fields(cls) if f.metadata["required"])
            return r.mapping(node, key, keys(cls), (*own, *_groups(cls)))
        allowed = keys(cls, group)
        given = r.mapping(node, key, allowed)
        if isinstance(node, yaml.MappingNode) and not node.value:
            raise r.fail(node, key, f"give at least one of {', '.join(allowed)}")
        return given

    return check


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def read(r: Reader, cls: type[C], node: yaml.Node, key: str) -> C:
    """A `cls` from a YAML mapping, every field read by its own check; INVALID, with the
    errors kept in `r`, when anything in it is wrong."""
    before = len(r.errors)
    top = r.attempt(_mapping(cls, ""), node, key)
    if top is INVALID:
        return INVALID  # type: ignore[no-any-return]
    levels = {"": top}
    for group in _groups(cls):
        if group in top:
            levels[group] = r.attempt(_mapping(cls, group), top[group], _join(key, group))
    values: dict[str, Any] = {}
    for f in fields(cls):
        group, name = f.metadata["group"], yaml_key(f)
        level = levels.get(group)
        if isinstance(level, dict) and name in level:
            path = _join(key, group, name)
            values[f.name] = r.attempt(f.metadata["check"], level[name], path)
            if values[f.name] is not INVALID:
                r.found[path] = values[f.name]
    if len(r.errors) > before:
        return INVALID  # type: ignore[no-any-return]
    for f in fields(cls):
        if f.name not in values and f.metadata["fallback"] is not None:
            values[f.name] = f.metadata["fallback"](values)
    return cls(**values)


def as_read(r: Reader, cls: type, node: yaml.Node, key: str, name: str) -> Any:
    """Field `name` of the `cls` mapping at `node` as its own check read it, whatever else
    failed: a check across fields runs on it, so one run reports its error beside the others.
    The field's default where the mapping leaves it out; INVALID where its check failed, or
    `node` is no mapping."""
    f = next(f for f in fields(cls) if f.name == name)
    if not isinstance(node, yaml.MappingNode) or f.metadata["group"]:
        return INVALID
    if child(node, yaml_key(f)) is node:  # not given
        return INVALID if f.default is MISSING else f.default
    return r.found.get(_join(key, yaml_key(f)), INVALID)


def default_name(url: str) -> str:
    """A target's name when none is given: its host:port."""
    parts = urlsplit(url)
    return parts.netloc.rsplit("@", 1)[-1] or url
