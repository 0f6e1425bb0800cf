"""Tests that speak HTTP/1.1 to the proxy on raw sockets or through aiohttp, and the upstream
that echoes: a connection, one response read by its framing, one exchange's outward shape."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohttp

from harness.scripted import ok

SSE = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'


async def echo(request: bytes, writer: asyncio.StreamWriter) -> bool:
    """The request line, headers and body as the upstream got them; /stream answers chunked."""
    if b" /stream " in request.split(b"\r\n", 1)[0]:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(SSE), SSE))
    else:
        writer.write(ok(request))
    return True


async def response(reader: asyncio.StreamReader) -> tuple[bytes, dict[str, str], bytes]:
    """One response: status line, headers (lower-cased names), body by its framing."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    status, *lines = head[:-4].decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        body = b""
        while size := int(await reader.readuntil(b"\r\n"), 16):
            body += (await reader.readexactly(size + 2))[:-2]
        await reader.readexactly(2)
    else:
        body = await asyncio.wait_for(reader.read(), 10)  # until the connection closes
    return status.encode(), headers, body


async def connect(port: int, receive_buffer: int | None = None) -> tuple[Any, Any]:
    sock = socket.socket()
    if receive_buffer is not None:  # a client that reads nothing fills up soon
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock)


async def fetch(
    session: aiohttp.ClientSession, base: str, method: str, path: str, body: dict[str, Any] | None
) -> tuple[int, str | None, str | None, bytes]:
    async with session.request(method, base + path, json=body) as resp:
        length = resp.headers.get("Content-Length")
        return resp.status, resp.headers.get("Content-Type"), length, await resp.read()
