"""The proxy side of one config, built whole: a reload builds the next beside it and the proxy
swaps one pointer (blackbox_exporter's `SafeConfig`). A connection takes the settings at its
accept and again after each response, a request at its start, and each keeps what it took to
its end: a request in flight finishes under the routes, engine and limits it began with, the
next one on the same keep-alive connection meets the new ones."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.config import ProxyConfig
from exporter.engines.base import ProxyHooks
from exporter.proxy.connection import Deadlines
from exporter.proxy.routes import Router
from exporter.proxy.upstream import UpstreamPool


@dataclass(frozen=True, slots=True)
class Settings:
    config: ProxyConfig
    engine: ProxyHooks  # the upstream's kind: what to ask it for, how its connections behave
    router: Router
    pool: UpstreamPool  # kept across a reload that leaves the upstream and its timeouts
    deadlines: Deadlines

    @property
    def reserve(self) -> int:
        """The buffered bytes kept for ordinary requests whatever large uploads hold: an
        eighth, as long as one max_body_bytes body still fits beside it."""
        config = self.config
        return min(
            config.max_buffered_bytes // 8, config.max_buffered_bytes - config.max_body_bytes
        )


def build(config: ProxyConfig, engine: ProxyHooks, previous: Settings | None = None) -> Settings:
    """The settings of `config`; the previous pool where its upstream and timeouts are the same
    (no await: built beside the running settings, nothing of them changed)."""
    where = (config.upstream, config.connect_timeout, config.read_timeout)
    pool = (
        previous.pool
        if previous is not None
        and where
        == (previous.config.upstream, previous.config.connect_timeout, previous.config.read_timeout)
        else UpstreamPool(*where)
    )
    deadlines = Deadlines(
        config.header_timeout, config.body_timeout, config.write_timeout, config.idle_timeout
    )
    return Settings(config, engine, Router(config), pool, deadlines)
