"""Fuzzing the proxy both ways, in one process: seeded random cases thrown at a running proxy.

Client side: request bytes (request lines, headers, chunked bodies with trailers, transfer
codings, header floods, TLS and binary starts, hop-by-hop tricks, bodies routing cannot read,
pipelining, truncation, flipped and junk bytes) against an upstream that answers every request
it gets with one known response. Each answer the client reads must be that response or a clean
error (vLLM's error shape, then the connection closes); nothing else. No trailer ever reaches
the upstream as a header, and no client moves an internal-error counter.

Upstream side: response bytes (status lines, header sets, Content-Length / chunked /
until-close framing, truncation, bad chunk sizes, giant and split SSE events, invalid UTF-8,
JSON of odd shapes, per-request objects with wrong types or impossible counts, model names that
cannot be encoded, CR/LF/CRLF-framed events, CR or LF inside header values) answering a normal
completion. A well-formed response reaches the client exactly (status and body); a broken one
gives a clean 502/504 or a cut stream whose bytes are a prefix of what was sent. Each case is
accounted exactly once, the route counters stay consistent (accepted <= proposed, none
negative, no position past k) and the sidecar's page still renders.

Both: no exception reaches the event loop, and the proxy still serves a plain request after
every batch. `tests/inprocess/test_proxy_fuzz.py` runs bounded counts in CI;
`python -m tests.fuzz --cases 20000` is the long run (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import generate_latest

from exporter.sidecar import Sidecar
from harness.rig import sidecar
from harness.scripted import scripted

OK_BODY = b'{"object":"list","data":[]}'
OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%b" % (
    len(OK_BODY),
    OK_BODY,
)
CLEAN_ERRORS = {400, 408, 413, 431, 501, 502, 503, 504}
READ_TIMEOUT = 3.0


@dataclass
class Tally:
    cases: int = 0
    answered: int = 0  # responses read
    clean_errors: int = 0
    cut: int = 0
    loop_errors: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def problem(self, case: int, what: str) -> None:
        if len(self.problems) < 20:
            self.problems.append(f"case {case}: {what}")


# ---- parsing what the client got -------------------------------------------------------


def responses(data: bytes) -> tuple[list[tuple[int, dict[str, str], bytes]], bytes]:
    """The complete responses in `data` (Content-Length or chunked framing) and what is left."""
    out = []
    while data:
        end = data.find(b"\r\n\r\n")
        if end == -1:
            break
        lines = data[:end].decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
        rest = data[end + 4 :]
        if "content-length" in headers:
            n = int(headers["content-length"])
            if len(rest) < n:
                break
            out.append((status, headers, rest[:n]))
            data = rest[n:]
        elif headers.get("transfer-encoding") == "chunked":
            body, pos = b"", 0
            while True:
                line = rest.find(b"\r\n", pos)
                if line == -1:
                    return out, data
                size = int(rest[pos:line], 16)
                if not size:
                    if rest[line + 2 : line + 4] != b"\r\n":
                        return out, data
                    pos = line + 4
                    break
                body += rest[line + 2 : line + 2 + size]
                pos = line + 4 + size
            out.append((status, headers, body))
            data = rest[pos:]
        else:
            out.append((status, headers, rest))  # until close
            data = b""
    return out, data


def clean_error(status: int, headers: dict[str, str], body: bytes) -> bool:
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return status in CLEAN_ERRORS and error.get("code") == status and "message" in error


# ---- client side ------------------------------------------------------------------------

BASE = [
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b'Content-Length: 52\r\n\r\n{"model":"m","messages":[],"stream":false,"user":"f"}'[:-1],
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'5\r\n{"pro\r\n9\r\nmpt":"x"}\r\n0\r\n\r\n',
    b"GET /v1/models HTTP/1.0\r\n\r\n",
    b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"2\r\n{}\r\n0\r\nX-Smuggled: 1\r\nAuthorization: Bearer t\r\n\r\n",  # trailers
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: X-Hop\r\nX-Hop: 1\r\n\r\n",
    b"GET /agent?q=1 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2008\r\n\r\n"
    + b'{"a":'
    + b"[" * 1000
    + b"]" * 1000
    + b"}",  # deeper than the routing's JSON reader
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 30\r\n\r\n"
    + '{"stream": true}'.encode("utf-16-le")[:30],
    b"\x16\x03\x01\x00\xf4\x01\x00\x00\xf0\x03\x03" + bytes(range(40)),  # TLS
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"X: v\r\n" * 200 + b"\r\n",
]
JUNK = [b"\x00", b"\r\n", b"\n", b" ", b"\xff\xfe", b":", b"HTTP/1.1", b"\t", b"%00", b"\x7f",
        b"Transfer-Encoding: chunked\r\n", b"Content-Length: 5\r\n", b"Content-Length: -1\r\n",
        b"Expect: 100-continue\r\n", b"Connection: close\r\n", b"Upgrade: h2c\r\n",
        b"Host: a\r\nHost: b\r\n", b"X-Route: voice\r\n", b"GET http://evil/ HTTP/1.1\r\n",
        b"CONNECT a:443 HTTP/1.1\r\n", b"fffffffff\r\n", b"0\r\n\r\n", b"A" * 9000,
        b"Transfer-Encoding: gzip, chunked\r\n", b"0\r\nX-Trailer: 1\r\n\r\n",
        b"Connection: host\r\n", b"\x16\x03\x01"]  # fmt: skip


def client_case(rng: random.Random) -> bytes:
    """One connection's bytes: one to three requests, mutated."""
    parts = [rng.choice(BASE) for _ in range(rng.choice((1, 1, 2, 3)))]
    data = bytearray(b"".join(parts))
    for _ in range(rng.choice((0, 1, 1, 2, 4))):
        kind = rng.random()
        at = rng.randrange(len(data) + 1)
        if kind < 0.35:
            data[at:at] = rng.choice(JUNK)
        elif kind < 0.6 and data:
            data[min(at, len(data) - 1)] = rng.randrange(256)
        elif kind < 0.8:
            del data[at : at + rng.randrange(1, 12)]
        else:
            data = data[:at]  # truncated: the proxy times the rest out
    return bytes(data)


SMUGGLED: list[bytes] = []  # request heads that reached the upstream with a trailer in them


async def echo_ok(request: bytes, writer: asyncio.StreamWriter) -> bool:
    if b"x-smuggled" in request.partition(b"\r\n\r\n")[0].lower():
        SMUGGLED.append(request[:300])
    writer.write(OK)
    await writer.drain()
    return True


async def run_client_case(port: int, data: bytes, case: int, tally: Tally) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    got = b""
    try:
        for at in range(0, len(data), 4096):
            writer.write(data[at : at + 4096])
        await writer.drain()
        deadline = time.monotonic() + READ_TIMEOUT
        while time.monotonic() < deadline:
            try:
                chunk = await asyncio.wait_for(reader.read(65536), deadline - time.monotonic())
            except TimeoutError:
                break
            if not chunk:
                break
            got += chunk
    except ConnectionError:
        pass
    finally:
        writer.close()
    answers, rest = responses(got)
    if rest and not rest.startswith(b"HTTP/1.1 100"):
        tally.problem(case, f"bytes that are no response: {rest[:120]!r} (sent {data[:200]!r})")
    for status, headers, body in answers:
        tally.answered += 1
        if status == 100:
            continue
        if (status, body) == (200, OK_BODY):
            continue
        if clean_error(status, headers, body):
            tally.clean_errors += 1
            continue
        tally.problem(case, f"unexpected answer {status} {body[:120]!r} (sent {data[:200]!r})")


# ---- upstream side ----------------------------------------------------------------------


@dataclass
class UpstreamCase:
    response: bytes  # what the upstream writes, then it closes
    valid: bool  # well-formed and complete: the client must get exactly this
    status: int
    body: bytes  # the body as meant (de-framed)
    stream: bool
    usage: bool  # the request asks for usage (so nothing is stripped on the way back)


def sse_body(rng: random.Random, usage: bool) -> bytes:
    """Events framed with one line end throughout (LF, CRLF or CR: the SSE grammar's three)."""
    return _sse_events(rng, usage).replace(b"\n", rng.choice((b"\n", b"\n", b"\r\n", b"\r")))


LONG_HISTOGRAM = json.dumps({  # 3,001 positions for a k = 3 model: never 3,000 labels
    "num_spec_steps": 3000, "num_draft_tokens": 9000, "num_accepted_draft_tokens": 0,
    "acceptance_histogram": [1] * 3000 + [0],
})  # fmt: skip
MODELS = ["m", "evil\\ud800", "x" * 300, "tab\\there", "日本"]  # JSON escapes: the proxy decodes


def _sse_events(rng: random.Random, usage: bool) -> bytes:
    events = []
    for _i in range(rng.randrange(0, 12)):
        kind = rng.random()
        if kind < 0.5:
            text = rng.choice(["a", "é", "日本語", "\\u00e9", '\\"', "x" * rng.randrange(1, 40)])
            events.append(
                b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,'
                b'"delta":{"content":"%s"},"finish_reason":null}]}\n\n' % text.encode()
            )
        elif kind < 0.6:
            events.append(
                b"data: \xff\xfe\xc3(" + bytes(rng.randrange(256) for _ in range(8)) + b"\n\n"
            )
        elif kind < 0.7:
            events.append(
                b"data: "
                + rng.choice([b"[1,2]", b"null", b'{"choices":null}', b"{", b'""'])
                + b"\n\n"
            )
        elif kind < 0.75:
            events.append(b"data: " + b"y" * rng.choice((70_000, 300_000)) + b"\n\n")  # giant
        elif kind < 0.85:
            events.append(
                b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"%s"}]}\n\n'
                % rng.choice([b"stop", b"length", b"", b'\\"', b"\xff"])
            )
        else:
            events.append(b": comment\n\n" if rng.random() < 0.5 else b"event: x\ndata: y\n\n")
    if usage:
        spec = rng.choice([
            '{"num_spec_steps":2,"num_draft_tokens":6,"num_accepted_draft_tokens":3,"acceptance_histogram":[0,1,1,0]}',
            '{"num_spec_steps":"2","num_draft_tokens":6,"num_accepted_draft_tokens":3,"acceptance_histogram":[0,1,1,0]}',
            '{"num_spec_steps":2,"num_draft_tokens":1,"num_accepted_draft_tokens":3,"acceptance_histogram":[0,2]}',
            '{"num_spec_steps":-1,"num_draft_tokens":true,"num_accepted_draft_tokens":null}',
            '{"acceptance_histogram":"x"}', "[]", "null", '"x"', "1e400",
            LONG_HISTOGRAM,
            '{"num_spec_steps":1000000000000000,"num_draft_tokens":3000000000000000,"num_accepted_draft_tokens":1,"acceptance_histogram":[999999999999999,1,0,0]}',
        ])  # fmt: skip
        tokens = rng.choice(["3", '"3"', "null", "-5", "1e30", "[]"])
        events.append(
            b'data: {"id":"c","model":"%s","choices":[],"usage":{"prompt_tokens":1,'
            b'"completion_tokens":%s},"metrics":{"speculative_decoding":%s}}\n\n'
            % (rng.choice(MODELS).encode(), tokens.encode(), spec.encode())
        )
    events.append(b"data: [DONE]\n\n")
    return b"".join(events)  # chunked framing splits it anywhere, even mid-line


def upstream_case(rng: random.Random) -> UpstreamCase:
    stream = rng.random() < 0.7
    usage = rng.random() < 0.5
    status = rng.choice([200, 200, 200, 400, 404, 429, 500, 503])
    if stream and status == 200:
        body = sse_body(rng, usage)
        ctype = b"text/event-stream"
    else:
        body = rng.choice([
            b'{"id":"c","choices":[{"message":{"content":"hi"},"finish_reason":"stop"}],'
            b'"usage":{"completion_tokens":2},"model":"%s"}' % rng.choice(MODELS).encode(),
            b'{"usage":"x","metrics":{"speculative_decoding":[1]}}', b"[]", b"not json \xff",
            b'{"error":{"message":"bad","type":"BadRequestError","code":400}}', b"",
        ])  # fmt: skip
        ctype = b"application/json"
    framing = rng.choice(["length", "chunked", "chunked", "close"])
    head = b"HTTP/1.1 %d X\r\ncontent-type: %s\r\n" % (status, ctype)
    if rng.random() < 0.1:
        head = b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n" + head
    if framing == "length":
        framed = head + b"content-length: %d\r\n\r\n" % len(body) + body
    elif framing == "chunked":
        chunks, at = [], 0
        while at < len(body):
            n = rng.choice((1, 7, 64, 1000, 65536))
            ext = b";ext=1" if rng.random() < 0.05 else b""
            chunks.append(b"%x%s\r\n%s\r\n" % (len(body[at : at + n]), ext, body[at : at + n]))
            at += n
        framed = head + b"transfer-encoding: chunked\r\n\r\n" + b"".join(chunks) + b"0\r\n\r\n"
    else:
        framed = head + b"connection: close\r\n\r\n" + body
    valid = True
    mutation = rng.random()
    if mutation < 0.12:  # truncated
        framed = framed[: rng.randrange(len(framed))]
        valid = False
    elif mutation < 0.2:  # a bad status line or header
        bad = rng.choice(
            [
                b"HTTP/1.1 2x0 OK\r\n",
                b"HTTP/2 200 OK\r\n",
                b"garbage\r\n",
                b" x: y\r\n",
                b"ICY 200 OK\r\n",
                b"x-evil: a\nset-cookie: b\r\n",
                b"x-evil: a\rb\r\n",
                b"x-nul: a\x00b\r\n",
            ]
        )
        framed = (
            bad + framed.split(b"\r\n", 1)[1]
            if bad.startswith((b"H", b"g", b"I"))
            else framed.replace(b"\r\n", b"\r\n" + bad, 1)
        )
        valid = False
    elif mutation < 0.28 and framing == "chunked":  # a bad chunk size or chunk end
        at = framed.find(b"\r\n\r\n") + 4
        framed = (
            framed[:at]
            + rng.choice([b"zz\r\n", b"-1\r\n", b"5\r\nabc\r\n", b"0x5\r\n"])
            + framed[at:]
        )
        valid = False
    return UpstreamCase(framed, valid, status, body, stream, usage)  # fmt: skip


def replaying(cases: list[UpstreamCase]) -> Callable[[bytes, asyncio.StreamWriter], Any]:
    """An upstream that answers the n-th request with case n's bytes, then closes."""

    async def respond(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if not request.startswith(b"POST"):  # the sidecar's scrape of /metrics
            writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            return True
        doc = json.loads(request.partition(b"\r\n\r\n")[2])
        case = cases[int(doc["user"])]
        writer.write(case.response)
        await writer.drain()
        return False

    return respond


async def run_upstream_case(
    side: Sidecar, proxy: str, case: UpstreamCase, n: int, tally: Tally
) -> None:
    assert side.proxy is not None
    side.proxy.objects_missing = False  # what earlier cases taught it must not strip this one
    body: dict[str, Any] = {"model": "m", "messages": [], "user": str(n), "stream": case.stream}
    if case.stream and case.usage:
        body["stream_options"] = {"include_usage": True}
    raw = json.dumps(body).encode()
    request = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%b" % (
        len(raw),
        raw,
    )
    reader, writer = await asyncio.open_connection(*proxy.removeprefix("http://").split(":"))
    writer.write(request)
    got = b""
    try:
        while True:
            chunk = await asyncio.wait_for(reader.read(65536), READ_TIMEOUT)
            if not chunk:
                break
            got += chunk
            answers, _ = responses(got)
            if answers and answers[0][1].get("content-length") is not None:
                break
            if got.endswith(b"0\r\n\r\n") and answers:
                break
    except (TimeoutError, ConnectionError):
        pass
    finally:
        writer.close()
    answers, _rest = responses(got)
    tally.answered += 1
    if answers:
        status, headers, received = answers[0]
        if case.valid and (status, received) != (case.status, case.body):
            tally.problem(
                n,
                f"valid response altered: {status} {received[:100]!r} "
                f"!= {case.status} {case.body[:100]!r}",
            )
        elif not case.valid and status == case.status and not case.body.startswith(received):
            tally.problem(n, f"broken response relayed wrong: {received[:100]!r}")
        elif status != case.status:
            if case.valid or not clean_error(status, headers, received):
                tally.problem(
                    n, f"status {status} for {case.status} ({case.valid=}) {received[:100]!r}"
                )
            tally.clean_errors += 1
        return
    # no whole response: a stream cut after its head, its bytes a prefix of the body
    head_end = got.find(b"\r\n\r\n")
    if head_end == -1 or case.valid:
        if case.valid:
            tally.problem(n, f"no response to a valid case: {got[:200]!r}")
        elif got:
            tally.problem(n, f"a head cut short: {got[:200]!r}")
        tally.cut += 1
        return
    tally.cut += 1
    cut_body = _dechunk_prefix(got[head_end + 4 :])
    if not case.body.startswith(cut_body):
        tally.problem(n, f"cut stream is not a prefix: {cut_body[:100]!r}")


def _dechunk_prefix(data: bytes) -> bytes:
    out, pos = b"", 0
    while True:
        line = data.find(b"\r\n", pos)
        if line == -1:
            return out
        size = int(data[pos:line], 16)
        if len(data) < line + 2 + size:
            return out
        out += data[line + 2 : line + 2 + size]
        pos = line + 4 + size


# ---- the runs ---------------------------------------------------------------------------


@asynccontextmanager
async def loop_errors(tally: Tally) -> AsyncIterator[None]:
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(
        lambda _, ctx: tally.loop_errors.append(str(ctx.get("exception") or ctx.get("message")))
    )
    try:
        yield
    finally:
        loop.set_exception_handler(previous)


async def still_serves(proxy: str) -> bool:
    reader, writer = await asyncio.open_connection(*proxy.removeprefix("http://").split(":"))
    writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    writer.close()
    return head.startswith(b"HTTP/1.1 200")


async def fuzz_client(cases: int, seed: int, concurrency: int = 16) -> Tally:
    tally, rng = Tally(), random.Random(seed)
    async with (
        loop_errors(tally),
        scripted(echo_ok) as (up, _),
        sidecar(up, header_timeout=0.5, body_timeout=1.0, idle_timeout=1.0) as (side, proxy, _),
    ):
        SMUGGLED.clear()
        port = int(proxy.rsplit(":", 1)[1])
        for start in range(0, cases, concurrency):
            batch = [client_case(rng) for _ in range(min(concurrency, cases - start))]
            await asyncio.gather(
                *(run_client_case(port, d, start + i, tally) for i, d in enumerate(batch))
            )
            tally.cases += len(batch)
            if not await still_serves(proxy):
                tally.problem(start, "the proxy stopped serving")
                break
        for head in SMUGGLED[:5]:
            tally.problem(cases, f"a trailer reached the upstream as a header: {head!r}")
        if sum(side.faults.counts.values()):
            tally.problem(cases, f"clients moved internal-error counters: {side.faults.counts}")
        if side.proxy is not None and side.proxy.budget.held:
            tally.problem(cases, f"{side.proxy.budget.held} bytes still held after the run")
    return tally


async def fuzz_upstream(
    cases: int, seed: int, concurrency: int = 16
) -> tuple[Tally, dict[str, float]]:
    tally, rng = Tally(), random.Random(seed)
    all_cases = [upstream_case(rng) for _ in range(cases)]
    async with (
        loop_errors(tally),
        scripted(replaying(all_cases)) as (up, _),
        sidecar(up, read_timeout=2.0) as (side, proxy, _),
    ):
        for start in range(0, cases, concurrency):
            idx = range(start, min(start + concurrency, cases))
            await asyncio.gather(
                *(run_upstream_case(side, proxy, all_cases[i], i, tally) for i in idx)
            )
            tally.cases += len(idx)
        assert side.proxy is not None
        acc = side.proxy.accounting
        accounted = sum(acc.requests.values())
        routes = acc.summed()
        if accounted != cases:
            tally.problem(cases, f"{accounted} requests accounted for {cases} cases")
        for key, c in routes.items():
            if c.accepted > c.draft_tokens or min(c.accepted, c.draft_tokens, c.drafts or 0) < 0:
                tally.problem(cases, f"inconsistent counts for {key}: {c}")
            configured = key[1] == "sim-27b"  # the rig's model, k = 3; the others are not
            if len(c.per_position) > (3 if configured else 64):
                tally.problem(cases, f"positions past k for {key}: {len(c.per_position)}")
        try:
            generate_latest(side.registry).decode()
        except Exception as exc:  # the page must render whatever the upstream sent
            tally.problem(cases, f"/metrics does not render: {exc!r}")
        figures = {"accounted": float(accounted), "faults": float(sum(side.faults.counts.values()))}
    return tally, figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=20000, help="cases each way")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    started = time.monotonic()
    client = asyncio.run(fuzz_client(args.cases, args.seed))
    upstream, figures = asyncio.run(fuzz_upstream(args.cases, args.seed))
    took = time.monotonic() - started
    for name, t in (("client", client), ("upstream", upstream)):
        print(
            f"{name}: {t.cases} cases, {t.answered} answers, {t.clean_errors} clean errors, "
            f"{t.cut} cut, {len(t.problems)} problems, {len(t.loop_errors)} loop errors"
        )
        for p in t.problems + t.loop_errors:
            print("  ", p)
    print(f"upstream accounting: {figures}; {took:.0f} s")
    return (
        1
        if client.problems or upstream.problems or client.loop_errors or upstream.loop_errors
        else 0
    )


if __name__ == "__main__":
    sys.exit(main())
