"""Route rules: which configured route a request takes. First match wins.

A route's label value is always a configured name (or the default route), whatever the client
sends, so the `route` label's cardinality is bounded by the config. API keys are compared by
a prefix of their sha256, never stored or logged.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from exporter.config import ProxyConfig, Route


@dataclass(frozen=True, slots=True)
class Match:
    """The route a request takes and the path to forward (a matched path_prefix is removed)."""

    route: str
    path: str


class Router:
    def __init__(self, config: ProxyConfig) -> None:
        self.routes = config.routes
        self.default = config.default_route

    def match(self, path: str, headers: Mapping[str, str], body: Mapping[str, Any] | None) -> Match:
        key_hash: str | None = None
        for route in self.routes:
            if route.api_key_sha256_prefix is not None and key_hash is None:
                key_hash = _key_hash(headers)
            if _meets(route, path, headers, body, key_hash):
                prefix = route.path_prefix
                forwarded = path[len(prefix) :] or "/" if prefix else path
                return Match(route.name, forwarded)
        return Match(self.default, path)


_SLASHES = re.compile("/{2,}")


def normalized(path: str) -> str:
    """The path as an upstream may read it, for routing and accounting only (the bytes
    forwarded are the client's): percent-escapes decoded (uvicorn decodes them before vLLM
    routes, so `/v1/chat%2Fcompletions` and `/v1/%63hat/completions` are served as chat
    completions), runs of slashes made one, dot segments resolved (RFC 3986, 5.2.4)."""
    if "%" not in path and "//" not in path and "/." not in path:
        return path  # the common case, untouched
    decoded = _SLASHES.sub("/", unquote(path, errors="surrogateescape"))
    out: list[str] = []
    for segment in decoded.split("/")[1:]:
        if segment == "..":
            if out:
                out.pop()
        elif segment != ".":
            out.append(segment)
    tail = "/" if decoded.endswith(("/.", "/..")) else ""
    return "/" + "/".join(out) + tail


def _meets(
    route: Route,
    path: str,
    headers: Mapping[str, str],
    body: Mapping[str, Any] | None,
    key_hash: str | None,
) -> bool:
    if any(headers.get(name) != value for name, value in route.headers):
        return False
    prefix = route.path_prefix
    if prefix is not None and not (path == prefix or path.startswith(prefix + "/")):
        return False
    if route.model is not None and (body is None or body.get("model") != route.model):
        return False
    if route.user is not None and (body is None or body.get("user") != route.user):
        return False
    return route.api_key_sha256_prefix is None or (
        key_hash is not None and key_hash.startswith(route.api_key_sha256_prefix)
    )


def _key_hash(headers: Mapping[str, str]) -> str | None:
    """sha256 hex of the bearer token (or x-api-key), the only form a key is ever handled in."""
    auth = headers.get("authorization", "")
    token = auth[7:].strip() if auth[:7].lower() == "bearer " else headers.get("x-api-key", "")
    return hashlib.sha256(token.encode()).hexdigest() if token else None
