"""The proxy's own health families: upstream errors, refusals, sheds, deadlines, buffers and
connections, built on each scrape from its counters."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.export.collector import FamiliesCollector
from exporter.proxy.forward import Proxy


class ProxyCollector(FamiliesCollector):
    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy

    def collect(self) -> Iterator[Metric]:
        proxy = self.proxy
        errors = _counter(
            "specdec_proxy_upstream_errors",
            "Upstream failures: connection (502, nothing sent), closed (502, closed after the "
            "request was written; never re-sent), timeout (504), broken (cut mid-way), malformed "
            "(not valid HTTP/1.1).",
            "reason",
            proxy.stats.upstream_errors,
        )
        framing = _counter(
            "specdec_proxy_upstream_framing_errors",
            "Upstream responses that are not well-formed HTTP/1.1, by the rule they broke "
            "(status_line, header_line, head_too_long, content_length, chunk_size, "
            "chunk_overrun, unasked_switch): each a 502 before the head, a cut after it.",
            "reason",
            proxy.stats.framing_errors,
        )
        refused = CounterMetricFamily(
            "specdec_proxy_refused_requests",
            "Requests refused: malformed, absolute URI, CONNECT, body too large, transfer coding "
            "not chunked, a head or body too slow.",
        )
        refused.add_metric([], float(proxy.stats.refused))
        crossed = CounterMetricFamily(
            "specdec_proxy_crossed_close_requests",
            "Requests that came on a keep-alive connection as the proxy closed it between "
            "requests (idle_timeout, a drain, or to make room at max_connections): never read "
            "or forwarded; the client read the 408 the proxy wrote before its close.",
        )
        crossed.add_metric([], float(proxy.stats.crossed_close))
        shed = _counter(
            "specdec_proxy_shed_requests",
            "Requests answered 503 (Retry-After) past a limit: max_connections, max_in_flight, "
            "max_buffered_bytes, or the process's file descriptors (for a client connection or "
            "an upstream one); and connections made to give their slot to a new one at "
            "max_connections: connections_idle_closed (keep-alive, between requests: closed), "
            "connections_silent_closed (new, nothing sent in its grace: 503, closed), "
            "connections_slow_head (a head trickling in under 512 B/s, or of the address "
            "holding the most slots: 408).",
            "limit",
            proxy.stats.shed,
        )
        timeouts = _counter(
            "specdec_proxy_client_timeouts",
            "Clients that missed a deadline: head, body (408), write (cut, upstream dropped), or "
            "stalled_body (an upload idle 1 s gave its buffered bytes back under pressure: 408).",
            "phase",
            proxy.stats.timeouts,
        )
        unreadable = _counter(
            "specdec_proxy_unreadable_requests",
            "Completion requests whose body is not a UTF-8 JSON object: relayed untouched, "
            "unaccounted.",
            "reason",
            proxy.stats.unreadable,
        )
        traces = _counter(
            "specdec_proxy_trace_contexts",
            "Requests forwarded by where their W3C traceparent came from: client (valid, "
            "forwarded as sent), started (none sent), or a client's replaced and never "
            "forwarded: malformed, oversized, duplicated.",
            "origin",
            proxy.stats.traces,
        )
        lines = _counter(
            "specdec_proxy_request_log_lines",
            "Request log lines queued (proxy.request_log), by why each was kept: failed, "
            "low_acceptance, slow, or sampled (a `sample` share of the rest).",
            "reason",
            dict(proxy.request_log.lines),
        )
        dropped = CounterMetricFamily(
            "specdec_proxy_request_log_dropped",
            "Request log lines lost: the queue to its writer thread was full (the log's "
            "output blocked or slow; the relay never waits for it), or the line failed.",
        )
        dropped.add_metric([], float(proxy.request_log.dropped + proxy.request_log.unwritten))
        buffered = GaugeMetricFamily(
            "specdec_proxy_buffered_bytes",
            "Bytes held now for request bodies, whole responses and SSE events.",
            value=float(proxy.budget.held),
        )
        limit = GaugeMetricFamily(
            "specdec_proxy_buffered_bytes_limit",
            "max_buffered_bytes: past it requests are shed.",
            value=float(proxy.budget.limit),
        )
        cut = CounterMetricFamily(
            "specdec_proxy_drain_cut_requests",
            "Requests still in flight when a drain's grace (drain_timeout) ran out: closed.",
        )
        cut.add_metric([], float(proxy.stats.cut_at_drain))
        in_flight = GaugeMetricFamily(
            "specdec_proxy_in_flight_requests", "Requests sent upstream and not over yet."
        )
        in_flight.add_metric([], float(proxy.stats.in_flight))
        clients = GaugeMetricFamily(
            "specdec_proxy_client_connections", "Client connections open to the proxy."
        )
        clients.add_metric([], float(proxy.client_connections))
        yield from (errors, framing, refused, crossed, shed, timeouts, unreadable, buffered)
        yield from (limit, cut, traces, lines, dropped)
        yield from (in_flight, clients)


def _counter(name: str, documentation: str, label: str, counts: dict[str, int]) -> Metric:
    family = CounterMetricFamily(name, documentation, labels=[label])
    for value, n in sorted(counts.items()):
        family.add_metric([value], float(n))
    return family
