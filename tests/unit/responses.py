"""Upstream responses in every framing the proxy relays, and read boundaries to cut them at."""

from __future__ import annotations

import itertools

SSE = [b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n', b"data: [DONE]\n\n"]
CHUNKED_BODY = b"".join(SSE)

RESPONSES: dict[str, tuple[str, bytes, bytes, bool]] = {
    # name: (method, raw response, body, reusable afterwards)
    "length": ("GET", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", b"hello", True),
    "empty length": ("GET", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", b"", True),
    "chunked": (
        "POST",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in SSE)
        + b"0\r\n\r\n",
        CHUNKED_BODY,
        True,
    ),
    "chunk extensions and trailers": (
        "POST",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\n"
        b"5;name=value\r\nhello\r\n1\r\n!\r\n0\r\nX-Trailer: yes\r\nX-Other: 1\r\n\r\n",
        b"hello!",
        True,
    ),
    "until close": ("GET", b"HTTP/1.0 200 OK\r\n\r\nall of it", b"all of it", False),
    "connection close": (
        "GET",
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        b"ok",
        False,
    ),
    "head": ("HEAD", b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n", b"", True),
    "no content": ("DELETE", b"HTTP/1.1 204 No Content\r\n\r\n", b"", True),
    "early hints": (
        "GET",
        b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        b"ok",
        True,
    ),
}


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]
