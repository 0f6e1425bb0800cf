"""The framing of one HTTP/1.1 response, read by read: pure, no I/O, no clock.

The upstream is one known HTTP/1.1 server (vLLM's uvicorn), so the framings needed are
Content-Length, chunked (extensions and trailers skipped) and until-close bodies, plus bodiless
responses (HEAD, 204, 304) and interim 1xx heads. Strict where a lax reading could relay the
wrong bytes: chunk sizes are hex digits only, a chunk must end where its size says, a CR, LF or
NUL inside a header line is refused (relayed, it would split the client's response). Header
bytes are kept as sent (decoded with surrogateescape, which the writer reverses exactly).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

MAX_HEAD = 64 * 1024  # bytes of status line and headers
_HEX = b"0123456789abcdefABCDEF"

_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _UNTIL_CLOSE, _DONE = range(8)


# why a response is not well-formed (FramingError.reason: the metric's label values)
FRAMING_REASONS = (
    "status_line",  # not HTTP/1.x NNN
    "header_line",  # no colon, folded, or a CR, LF or NUL inside it
    "head_too_long",  # head or chunk line past MAX_HEAD
    "content_length",  # not a whole number
    "chunk_size",  # not hex digits only, or past MAX_CHUNK
    "chunk_overrun",  # a chunk longer than its size says
    "unasked_switch",  # 101 Switching Protocols that no request asked for
)
MAX_CHUNK = 1 << 32  # bytes: a chunk size beyond is no engine's (and 24 hex digits overflowed)


class FramingError(ValueError):
    """The response is not well-formed HTTP/1.1; `reason` is one of FRAMING_REASONS."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Head:
    status: int
    reason: str
    headers: list[tuple[str, str]]  # as sent
    fields: dict[str, str]  # lower-case name -> its first value

    def get(self, name: str) -> str | None:
        return self.fields.get(name.lower())


class ResponseFramer:
    """Feed it the connection's reads; it returns the body bytes each one completes
    (de-chunked), sets `head` once the final head is read and `done` once the response ends."""

    def __init__(self, method: str) -> None:
        self._method = method
        self._state = _HEAD
        self._buffer = b""
        self._left = 0  # body bytes left: Content-Length or the current chunk
        self._keep_alive = False
        self.chunked = False  # the body came chunked (a stream, as engines send them)
        self.head: Head | None = None
        self.done = False  # the response ended (an attribute: read after every read)

    @property
    def reusable(self) -> bool:
        """The connection may carry another request: keep-alive, nothing after the response."""
        return self._state == _DONE and self._keep_alive and not self._buffer

    def closed(self) -> bool:
        """The connection closed: True when that is how this response ends (until-close)."""
        if self._state == _UNTIL_CLOSE:
            self._keep_alive = False
            self._state = _DONE
            self.done = True
        return self.done

    def feed(self, data: bytes) -> bytes:
        """Consume `data`; return the body bytes it completes. FramingError when malformed."""
        out: list[bytes] = []
        pos = 0
        if self._state == _CHUNK_SIZE and not self._buffer:
            # the common reads of a stream: whole chunks (vLLM writes one SSE event per chunk,
            # several arrive together under load), taken without the state machine
            while (line := data.find(b"\r\n", pos, pos + 18)) > pos:
                size = _chunk_size(data[pos:line])
                end = line + 2 + size
                if not size or data[end : end + 2] != b"\r\n":
                    break
                out.append(data[line + 2 : end])
                pos = end + 2
            if pos == len(data):
                return b"".join(out) if len(out) != 1 else out[0]
        buffer = self._buffer + data if self._buffer else data
        while pos < len(buffer):
            state = self._state
            if state in (_CHUNK_DATA, _LENGTH):
                end = min(len(buffer), pos + self._left)
                out.append(buffer[pos:end])
                self._left -= end - pos
                pos = end
                if self._left == 0:
                    self._state = _CHUNK_END if state == _CHUNK_DATA else _DONE
            elif state == _UNTIL_CLOSE:
                out.append(buffer[pos:])
                pos = len(buffer)
            elif state == _DONE:
                break  # bytes after the response: left in the buffer, the connection is dropped
            else:
                end = buffer.find(b"\r\n\r\n" if state == _HEAD else b"\r\n", pos)
                if end == -1:
                    if len(buffer) - pos > MAX_HEAD:
                        raise FramingError("head_too_long", "header or chunk line too long")
                    break
                if state == _HEAD:
                    self._on_head(buffer[pos:end])
                    pos = end + 4
                elif state == _CHUNK_SIZE:
                    self._left = _chunk_size(buffer[pos:end])
                    self._state = _CHUNK_DATA if self._left else _TRAILER
                    pos = end + 2
                elif state == _CHUNK_END:
                    if end != pos:
                        raise FramingError("chunk_overrun", "chunk longer than its size")
                    self._state = _CHUNK_SIZE
                    pos = end + 2
                else:  # _TRAILER: lines until an empty one
                    self._state = _DONE if end == pos else _TRAILER
                    pos = end + 2
        self._buffer = buffer[pos:]
        self.done = self._state == _DONE
        return b"".join(out) if len(out) != 1 else out[0]

    def _on_head(self, raw: bytes) -> None:
        lines = raw.decode("utf-8", "surrogateescape").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or not code.isdigit() or _splits(lines[0]):
            raise FramingError("status_line", f"bad status line {lines[0][:80]!r}")
        status = int(code)
        headers = []
        fields: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip() or _splits(line):
                raise FramingError("header_line", f"bad header line {line[:80]!r}")
            value = value.strip()
            headers.append((name, value))
            fields.setdefault(name.lower(), value)
        head = Head(status, reason, headers, fields)
        if status == 101:  # the proxy forwards no Upgrade: the bytes after it are no HTTP
            raise FramingError("unasked_switch", "101 Switching Protocols, unasked")
        if status < 200:
            return  # interim (103 Early Hints): the real head follows
        connection = (head.get("connection") or "").lower()
        self._keep_alive = version == "HTTP/1.1" and "close" not in connection
        length = head.get("content-length")
        if self._method == "HEAD" or status in (204, 304):
            self._state = _DONE
        elif "chunked" in (head.get("transfer-encoding") or "").lower():
            self._state = _CHUNK_SIZE
            self.chunked = True
        elif length is not None:
            if not length.isdigit():
                raise FramingError("content_length", f"bad Content-Length {length[:20]!r}")
            self._left = int(length)
            self._state = _LENGTH if self._left else _DONE
        else:
            self._state = _UNTIL_CLOSE
        self.head = head


def _splits(line: str) -> bool:
    """A CR, LF or NUL inside a head line: relayed, it would split the client's response."""
    return "\r" in line or "\n" in line or "\x00" in line


@functools.lru_cache(maxsize=1024)  # a stream repeats a few sizes; C lookup, no re-parsing
def _chunk_size(line: bytes) -> int:
    """A chunk-size line's size: hex digits only (int() would also take a sign, 0x, _), at
    most MAX_CHUNK (Python's int never overflows, so a 24-digit size read as a huge chunk and
    relayed what followed as data)."""
    size = line.split(b";", 1)[0].rstrip(b" \t")
    if not size or size.strip(_HEX):
        raise FramingError("chunk_size", f"bad chunk size {line[:20]!r}")
    if len(size.lstrip(b"0")) > 9 or (value := int(size, 16)) > MAX_CHUNK:
        raise FramingError("chunk_size", f"chunk size too large {line[:20]!r}")
    return value
