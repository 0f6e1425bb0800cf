"""The W3C traceparent rules (`exporter/proxy/trace.py`): what is honoured, what is replaced
and why, and that nothing a client sends costs more than its first 55 bytes of work."""

from __future__ import annotations

import re
import time

import pytest

from exporter.proxy.trace import carry, started, verdict

GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
FRESH = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01")


def _carried(*fields: tuple[str, str]) -> tuple[list[tuple[str, str]], str, str]:
    headers: dict[str, str] = {}
    for k, v in fields:
        headers.setdefault(k.lower(), v)
    out, trace = carry(headers, list(fields))
    return out, trace.traceparent, trace.origin


def test_a_valid_one_passes_unchanged_with_its_tracestate() -> None:
    out, sent, origin = _carried(("Host", "x"), ("traceparent", GOOD), ("tracestate", "a=1"))
    assert (sent, origin) == (GOOD, "client")
    assert out == [("Host", "x"), ("tracestate", "a=1"), ("traceparent", GOOD)]


def test_none_sent_starts_a_sampled_one() -> None:
    out, sent, origin = _carried(("Host", "x"))
    assert origin == "started" and FRESH.fullmatch(sent)
    assert out == [("Host", "x"), ("traceparent", sent)]
    assert started().trace_id != started().trace_id


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (GOOD.upper().replace("0X", "0x"), "malformed"),  # uppercase hex
        ("01" + GOOD[2:], "malformed"),  # only version 00 is honoured
        ("ff" + GOOD[2:], "malformed"),
        ("00-" + "0" * 32 + GOOD[35:], "malformed"),  # all-zero trace id
        (GOOD[:36] + "0" * 16 + GOOD[52:], "malformed"),  # all-zero parent id
        (GOOD[:-1], "malformed"),  # short
        (GOOD.replace("-", "_"), "malformed"),
        (GOOD[:-2] + "0g", "malformed"),
        (GOOD + "-extra", "oversized"),
        (GOOD + "0" * 8000, "oversized"),
        ("", "malformed"),
    ],
)
def test_a_bad_one_is_replaced_never_forwarded(value: str, why: str) -> None:
    out, sent, origin = _carried(("traceparent", value), ("TraceState", "a=1"))
    assert origin == why and FRESH.fullmatch(sent) and sent != value
    assert out == [("traceparent", sent)]  # neither it nor its tracestate goes upstream


def test_a_repeated_one_is_replaced_even_when_both_are_valid() -> None:
    out, sent, origin = _carried(("traceparent", GOOD), ("Traceparent", GOOD))
    assert origin == "duplicated" and sent != GOOD
    assert [v for k, v in out if k.lower() == "traceparent"] == [sent]


def test_a_tracestate_alone_is_dropped() -> None:
    out, _, origin = _carried(("tracestate", "a=1"))
    assert origin == "started" and [k for k, _ in out] == ["traceparent"]


def test_the_verdict_reads_no_more_than_the_length_of_a_huge_value() -> None:
    huge = ["0" * 8_000_000]
    begin = time.perf_counter()
    for _ in range(1000):
        assert verdict(huge) == "oversized"
    assert time.perf_counter() - begin < 0.05  # a length test, not a scan of 8 MB a time
