"""A TCP tap between the proxy and a real upstream: it relays both ways unchanged and keeps what
the upstream sent on each connection, so a test can hold the proxy's output against the very
bytes the upstream gave it. Two identical requests to a real vLLM on two busy cores can be cut
into events differently (its HTTP side merges the outputs of steps it fell behind on), so a
direct reply is a reference for the bytes' form, not for where the events fall.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Wiretap:
    """Listens on 127.0.0.1 and relays each connection to `host:port`; `received` holds, per
    connection in the order they were accepted, the bytes the upstream sent back."""

    host: str
    port: int
    received: list[bytearray] = field(default_factory=list)
    _server: asyncio.Server | None = None
    _pumps: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> str:
        """The tap's base URL."""
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for pump in list(self._pumps):
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    def mark(self) -> list[int]:
        """How many whole replies each connection has carried so far."""
        return [len(responses(bytes(r))) for r in self.received]

    def since(self, mark: list[int]) -> list[Response]:
        """The whole replies carried since `mark`, by connection."""
        now = [responses(bytes(r)) for r in self.received]
        return [
            reply
            for seen, n in zip(now, [*mark, *[0] * (len(now) - len(mark))], strict=True)
            for reply in seen[n:]
        ]

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        back = bytearray()
        self.received.append(back)
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        pumps = (
            asyncio.create_task(_pump(reader, up_writer, None)),
            asyncio.create_task(_pump(up_reader, writer, back)),
        )
        self._pumps.update(pumps)
        try:
            await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            self._pumps.difference_update(pumps)
            for w in (writer, up_writer):
                w.close()


async def _pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, keep: bytearray | None
) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            if keep is not None:
                keep += data
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(ConnectionError, OSError):
        writer.write_eof()


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes  # de-chunked


def responses(raw: bytes) -> list[Response]:
    """The HTTP/1.1 responses on one connection, in order (a body by Content-Length, chunked,
    or to the end of the stream); a truncated last one is left out."""
    out: list[Response] = []
    pos = 0
    while (end := raw.find(b"\r\n\r\n", pos)) != -1:
        head = raw[pos:end].decode("latin-1").split("\r\n")
        status = int(head[0].split()[1])
        headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(":") for line in head[1:])
        }
        pos = end + 4
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = bytearray()
            while True:
                line_end = raw.find(b"\r\n", pos)
                if line_end == -1:
                    return out
                size = int(raw[pos:line_end].split(b";")[0], 16)
                pos = line_end + 2
                if size == 0:
                    trailer_end = raw.find(b"\r\n", pos)
                    while trailer_end not in (-1, pos):  # trailer fields, then a blank line
                        pos = trailer_end + 2
                        trailer_end = raw.find(b"\r\n", pos)
                    if trailer_end == -1:
                        return out
                    pos += 2
                    break
                if len(raw) < pos + size + 2:
                    return out
                body += raw[pos : pos + size]
                pos += size + 2
        elif "content-length" in headers:
            length = int(headers["content-length"])
            if len(raw) < pos + length:
                return out
            body, pos = bytearray(raw[pos : pos + length]), pos + length
        else:
            body, pos = bytearray(raw[pos:]), len(raw)
        out.append(Response(status, headers, bytes(body)))
    return out


# the requests whose replies a proxy must pass on as the engine wrote them
TRANSPARENCY: dict[str, tuple[bool, bool, dict[str, bool] | None]] = {
    # case: (chat, stream, stream_options)
    "chat_stream_no_usage": (True, True, None),  # the proxy injects include_usage
    "chat_stream_include_usage": (True, True, {"include_usage": True}),
    "chat_whole": (True, False, None),
    "completions_stream_no_usage": (False, True, None),
    "chat_stream_continuous_only": (True, True, {"continuous_usage_stats": True}),
}


def relay_difference(got: bytes, upstream: Response, options: dict[str, bool] | None) -> str:
    """Where the reply the client got differs from the events the upstream sent the proxy
    ("" where it does not): every event, cut where the upstream cut it and byte for byte, less
    only what the proxy's own asking added where the client did not ask for it: vLLM's final
    usage event (`"choices":[]`), whose fingerprint vLLM would then have stamped on the
    terminal chunk; the per-event `usage` members, sent only with both options. An event so
    changed must equal, as JSON, the upstream's so changed. A whole reply: its body."""
    if not upstream.headers.get("content-type", "").startswith("text/event-stream"):
        return "" if got == upstream.body else "the body differs"
    usage = bool((options or {}).get("include_usage"))
    continuous = usage and bool((options or {}).get("continuous_usage_stats"))
    want: list[bytes | dict[str, Any]] = []
    finished: list[int] = []  # the events from the finish reason on
    for event in (e for e in upstream.body.split(b"\n\n") if e.strip()):
        payload = event.removeprefix(b"data: ")
        doc = None if payload == b"[DONE]" else json.loads(payload)
        if doc is not None and not usage and doc.get("choices") == []:
            if isinstance(fingerprint := doc.get("system_fingerprint"), str):
                for i in finished:
                    held = want[i]
                    held = dict(held) if isinstance(held, dict) else json.loads(held[6:])
                    want[i] = {**held, "system_fingerprint": fingerprint}
            continue
        if doc is not None and (finished or any(c.get("finish_reason") for c in doc["choices"])):
            finished.append(len(want))
        if doc is not None and not continuous and "usage" in doc and doc["choices"] != []:
            del doc["usage"]
            want.append(doc)
        else:
            want.append(event)
    events = [e for e in got.split(b"\n\n") if e.strip()]
    if len(events) != len(want):
        return f"{len(events)} events where the upstream's make {len(want)}"
    for i, (event, expected) in enumerate(zip(events, want, strict=True)):
        if isinstance(expected, bytes):
            same = event == expected
        else:
            payload = event.removeprefix(b"data: ")
            same = (
                b'"usage"' not in event and payload != b"[DONE]" and json.loads(payload) == expected
            )
        if not same:
            return f"event {i}: {event!r} where the upstream's is {expected!r}"
    return ""
