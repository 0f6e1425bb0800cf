"""What the proxy writes or reads whole on either side: a header list without its hop-by-hop
fields, a body as a JSON object, vLLM's error shape, and a budget hold given back."""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from exporter.proxy.budget import Hold
from exporter.proxy.writer import ResponseWriter, date_header

HOP_BY_HOP = frozenset(
    (
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "expect",  # the body is read whole before it is forwarded
    )
)


def end_to_end(fields: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """`fields` without the hop-by-hop ones: the fixed set and those `Connection` names
    (RFC 9110 §7.6.1)."""
    drop = HOP_BY_HOP
    for name, value in fields:
        if name.lower() == "connection":
            drop = drop | {token.strip().lower() for token in value.split(",")}
    return [(k, v) for k, v in fields if k.lower() not in drop]


def request_json(body: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """A body as a JSON object, or None and why not (an `UNREADABLE` reason). Only UTF-8 (what
    the splice writes): json.loads would also take UTF-16 and -32."""
    try:
        data = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "not_utf8"
    except ValueError:
        return None, "invalid_json"
    except RecursionError:
        return None, "too_deep"
    return (data, None) if isinstance(data, dict) else (None, "not_an_object")


def release(hold: Hold | None) -> None:
    if hold is not None:
        hold.release()


def closing(status: int, message: str) -> bytes:
    """A whole response in vLLM's error shape with `Connection: close` (and `Retry-After: 1`
    for a 503), as bytes: written where no request was read, so it fits any HTTP version."""
    kind = {408: "RequestTimeout", 503: "ServiceUnavailableError"}[status]
    body = json.dumps(
        {"error": {"message": message, "type": kind, "param": None, "code": status}}
    ).encode()
    retry = "Retry-After: 1\r\n" if status == 503 else ""
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
        f"{retry}Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def error_response(
    writer: ResponseWriter,
    status: int,
    message: str,
    kind: str,
    retry_after: int | None = None,
    extra: tuple[tuple[str, str], ...] = (),
) -> None:
    """OpenAI-shaped error, like vLLM's own; `extra`: fields of the proxy's (traceresponse)."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    reason = HTTPStatus(status).phrase
    headers = [("Content-Type", "application/json"), date_header()]
    if retry_after is not None:
        headers.append(("Retry-After", str(retry_after)))
    headers.extend(extra)
    writer.respond(status, reason, headers, json.dumps(body).encode())
