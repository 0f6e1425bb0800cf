"""Trace context through the proxy, on raw sockets to an upstream that echoes what it got: a
valid `traceparent` reaches the engine as sent, a bad one (malformed, oversized, repeated) is
replaced and never forwarded, logged once a period without its value; the client reads the
trace id back in `traceresponse`, also on the proxy's own 502."""

from __future__ import annotations

import asyncio
import re

import structlog

from harness.helpers import free_port
from harness.rig import sidecar
from harness.scripted import scripted
from harness.wire import echo, response

GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
FRESH = re.compile(rb"traceparent: (00-([0-9a-f]{32})-[0-9a-f]{16}-01)\r\n")


async def ask(port: int, fields: bytes) -> tuple[bytes, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n")
    try:
        return await response(reader)
    finally:
        writer.close()


async def test_valid_forwarded_bad_replaced_and_the_id_comes_back() -> None:
    with structlog.testing.capture_logs() as logs:
        async with scripted(echo) as (url, _), sidecar(url) as (side, proxy, _):
            port = int(proxy.rsplit(":", 1)[1])
            valid = f"traceparent: {GOOD}\r\ntracestate: a=1\r\n"
            _, headers, got = await ask(port, valid.encode())
            assert got.count(f"traceparent: {GOOD}\r\n".encode()) == 1
            assert b"tracestate: a=1\r\n" in got
            assert headers["traceresponse"] == GOOD

            secret = "00-" + "f" * 32 + "-" + "e" * 16 + "-01" + "S3CRET" * 100
            bad = [
                f"traceparent: {secret}\r\n",  # oversized
                "traceparent: 00-XYZ\r\ntracestate: leak=1\r\n",  # malformed
                f"traceparent: {GOOD}\r\ntraceparent: {GOOD}\r\n",  # repeated
                f"traceparent: {GOOD}\r\nTraceparent: {GOOD}\r\n",
            ]
            for fields in bad:
                _, headers, got = await ask(port, fields.encode())
                found = FRESH.findall(got)
                assert len(found) == 1, got  # one, fresh
                assert found[0][0].decode() not in fields and b"leak" not in got
                assert headers["traceresponse"] == found[0][0].decode()
            _, headers, got = await ask(port, b"")  # none: one started
            assert FRESH.search(got) and headers["traceresponse"] in got.decode()
            assert side.proxy is not None
            assert side.proxy.stats.traces == {
                "client": 1,
                "started": 1,
                "malformed": 1,
                "oversized": 1,
                "duplicated": 2,
            }
    replaced = [e for e in logs if e["event"] == "traceparent replaced: not forwarded"]
    # once per kind in the period (the second duplicate is not logged), never the value
    assert sorted(e["reason"] for e in replaced) == ["duplicated", "malformed", "oversized"]
    assert "S3CRET" not in repr(logs) and "XYZ" not in repr(logs)


async def test_the_proxys_own_502_carries_the_trace_id() -> None:
    async with sidecar(f"http://127.0.0.1:{free_port()}") as (_, proxy, _):
        status, headers, _ = await ask(
            int(proxy.rsplit(":", 1)[1]), f"traceparent: {GOOD}\r\n".encode()
        )
    assert status.startswith(b"HTTP/1.1 502") and headers["traceresponse"] == GOOD
