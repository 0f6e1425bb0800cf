"""Route rules: first match wins, every condition of a route must hold, a matched path prefix
is removed from the forwarded path, API keys are matched by their sha256 prefix only."""

from __future__ import annotations

import hashlib

import pytest

from exporter.config import ProxyConfig, Route
from exporter.proxy.routes import Match, Router, normalized

KEY = "sk-test-123"
KEY_PREFIX = hashlib.sha256(KEY.encode()).hexdigest()[:12]
ROUTES = (
    Route("voice", headers=(("x-route", "voice"),)),
    Route("agent", path_prefix="/agent"),
    Route("batch", model="m", user="nightly"),
    Route("partner", api_key_sha256_prefix=KEY_PREFIX),
    Route("voice_agent", headers=(("x-route", "voice"),), path_prefix="/agent"),  # shadowed
)
ROUTER = Router(ProxyConfig("http://127.0.0.1:8000", routes=ROUTES, default_route="other"))


def match(
    path: str = "/v1/chat/completions", body: dict[str, str] | None = None, **headers: str
) -> Match:
    return ROUTER.match(path, {k.replace("_", "-"): v for k, v in headers.items()}, body)


def test_a_header_route() -> None:
    assert match(x_route="voice") == Match("voice", "/v1/chat/completions")
    assert match(x_route="Voice").route == "other"  # values match exactly


def test_the_first_match_wins() -> None:
    assert match("/agent/v1/chat/completions", x_route="voice").route == "voice"


@pytest.mark.parametrize(
    ("path", "route", "forwarded"),
    [
        ("/agent/v1/chat/completions", "agent", "/v1/chat/completions"),
        ("/agent", "agent", "/"),
        ("/agent/", "agent", "/"),
        ("/agents/v1/models", "other", "/agents/v1/models"),  # a prefix ends at a segment
        ("/v1/agent", "other", "/v1/agent"),
    ],
)
def test_a_path_prefix_route_removes_its_prefix(path: str, route: str, forwarded: str) -> None:
    assert match(path) == Match(route, forwarded)


def test_body_fields_must_all_hold() -> None:
    assert match(body={"model": "m", "user": "nightly"}).route == "batch"
    assert match(body={"model": "m", "user": "daily"}).route == "other"
    assert match(body={"model": "m"}).route == "other"
    assert match(body=None).route == "other"  # not a JSON object: body conditions fail


@pytest.mark.parametrize(
    "headers",
    [
        {"authorization": f"Bearer {KEY}"},
        {"authorization": f"bearer   {KEY}  "},
        {"x-api-key": KEY},
    ],
)
def test_an_api_key_route_by_sha256_prefix(headers: dict[str, str]) -> None:
    assert ROUTER.match("/v1/completions", headers, None).route == "partner"


def test_other_keys_and_no_key_take_the_default_route() -> None:
    assert ROUTER.match("/v1/x", {"authorization": "Bearer sk-other"}, None).route == "other"
    assert ROUTER.match("/v1/x", {"authorization": "Basic abc"}, None).route == "other"
    assert ROUTER.match("/v1/x", {}, None) == Match("other", "/v1/x")


@pytest.mark.parametrize(
    ("path", "seen"),
    [
        ("/v1/chat/completions", "/v1/chat/completions"),
        ("/v1/chat%2Fcompletions", "/v1/chat/completions"),
        ("/v1/%63hat/completions", "/v1/chat/completions"),
        ("/v1/chat/completion%73", "/v1/chat/completions"),
        ("/v1//chat///completions", "/v1/chat/completions"),
        ("/v1/./chat/completions", "/v1/chat/completions"),
        ("/v1/x/../chat/completions", "/v1/chat/completions"),
        ("/%2e%2e/v1/chat/completions", "/v1/chat/completions"),
        ("/../../etc", "/etc"),
        ("/a/b/..", "/a/"),
        ("/agent/v1/models", "/agent/v1/models"),
    ],
)
def test_paths_are_read_as_the_upstream_reads_them(path: str, seen: str) -> None:
    assert normalized(path) == seen
