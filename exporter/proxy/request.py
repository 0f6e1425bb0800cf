"""A client's request as the proxy needs it, and a quick parse of the shape clients send.

Why two parsers: a general parser (llhttp through httptools, `reader.py`) calls back into
Python once per header and per body piece, tens of calls per request on the cold cache of a
proxy that slept between requests. `quick` takes only a strict subset of HTTP/1.1, the shape
OpenAI clients send (a token method, a plain origin-form URI, ASCII header fields, one Host,
at most one Content-Length, no Transfer-Encoding, Expect or Upgrade) with a few bytes methods,
and leaves anything else to llhttp, which serves it or refuses it. A differential test holds
`quick` to llhttp's reading of every request `quick` accepts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from exporter.proxy.budget import Hold

HEAD_LIMIT = 8190  # bytes of a head `quick` takes (llhttp's line limits are as large)
MAX_HEADERS = 128  # header fields of a request, on either path (aiohttp's max_headers)
MORE: Final = "more"  # `quick`: nothing wrong so far, but the request is not complete

_SEGMENT = rb"[-A-Za-z0-9_~][-A-Za-z0-9_~.]*"  # no dot segments, nothing to decode
_LINE = re.compile(
    rb"(GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS) (/(?:%b(?:/%b)*/?)?)(\?[!$-~]*)? HTTP/1\.([01])"
    % (_SEGMENT, _SEGMENT)
)
_START = re.compile(rb"[A-Z]{1,7}(?: |$)")  # what a request of `_LINE` begins with
_TOKEN = re.sub(rb"[^-!#$%&'*+.^_`|~0-9A-Za-z]", b"", bytes(range(128)))  # header name bytes
_VISIBLE = bytes(range(0x20, 0x7F)) + b"\t"  # header value bytes
_LLHTTP_ONLY = frozenset(("transfer-encoding", "expect", "upgrade"))
SINGLETONS = frozenset(  # fields a request may carry once (RFC 9110), as aiohttp's server checks
    ("content-length", "content-location", "content-range", "content-type", "etag", "host",
     "max-forwards", "server", "transfer-encoding", "user-agent")
)  # fmt: skip
_ONCE = SINGLETONS | {"connection"}  # quick leaves a repeated Connection to llhttp


@dataclass(slots=True)  # not frozen: a frozen dataclass is slower to make
class ClientRequest:
    method: str
    uri: str  # as sent: path and query
    path: str  # as sent, without the query (routes match it byte for byte)
    version: tuple[int, int]
    headers: Mapping[str, str]  # looked up by lower-case name: the first value
    fields: list[tuple[str, str]]  # as sent, in order
    should_close: bool
    upgrade: bool = False
    hold: Hold | None = None  # the bytes of its body, held in the budget until upstream has it


def quick(buffer: bytes | bytearray) -> tuple[ClientRequest, int, int] | str | None:
    """(request, where its body starts, Content-Length); MORE; or None: for llhttp.
    Plain bytes methods, not a regex per field: on a cold cache each one costs."""
    end = buffer.find(b"\r\n\r\n", 0, HEAD_LIMIT)
    if end == -1:
        # not the start of a request line (TLS, binary): llhttp refuses it at once
        more = len(buffer) < HEAD_LIMIT and _START.match(buffer, 0, 8) is not None
        return MORE if more else None
    first, *lines = buffer[:end].split(b"\r\n")
    line = _LINE.fullmatch(first)
    if line is None or len(lines) > MAX_HEADERS:
        return None
    fields: list[tuple[str, str]] = []
    headers: dict[str, str] = {}
    repeated = False  # a field that may come once came twice
    for raw in lines:
        name_b, colon, value_b = raw.partition(b":")
        if (
            not colon
            or not name_b
            or name_b.translate(None, _TOKEN)
            or value_b.translate(None, _VISIBLE)
        ):
            return None
        name, value = name_b.decode("ascii"), value_b.strip(b" \t").decode("ascii")
        fields.append((name, value))
        lower = name.lower()
        if lower not in headers:
            headers[lower] = value
        elif lower in _ONCE:
            repeated = True
    length = headers.get("content-length", "0")
    connection = headers.get("connection", "").lower()
    minor = line[4] == b"1"
    if (
        repeated
        or (minor and "host" not in headers)  # HTTP/1.1 requires it
        or not _LLHTTP_ONLY.isdisjoint(headers)
        or not length.isdigit()
        or len(length) > 15
        or "upgrade" in connection
    ):
        return None
    tokens = {t.strip() for t in connection.split(",")}
    path = line[2].decode("ascii")
    request = ClientRequest(
        line[1].decode("ascii"),
        path + line[3].decode("ascii") if line[3] else path,
        path,
        (1, 1) if minor else (1, 0),
        headers,
        fields,
        "close" in tokens if minor else "keep-alive" not in tokens,
    )
    return request, end + 4, int(length)
