"""An OTLP/HTTP trace receiver for tests: an engine started with `--otlp-traces-endpoint` (and
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf) posts its spans here. The bodies are kept
whole; a span's trace and parent ids are raw bytes in them (OTLP's `bytes` fields), so a test
asks whether a context's ids are there without decoding protobuf."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

MAX_BODY = 8 << 20  # an export batch of a test's spans is a few KiB


class SpanSink:
    """Listens on 127.0.0.1 while entered; `url` is the traces endpoint to give the engine."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        lock, bodies = threading.Lock(), self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(min(size, MAX_BODY))
                with lock:
                    bodies.append(data)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                return None

        self._lock = lock
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> SpanSink:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()

    def holds(self, traceparent: str) -> bool:
        """Whether a span posted so far carries this context's trace id and, as its parent,
        the context's parent id (the span is the child of the span that sent the request)."""
        _, trace_id, parent, _ = traceparent.split("-")
        ids = bytes.fromhex(trace_id), bytes.fromhex(parent)
        with self._lock:
            return any(all(i in body for i in ids) for body in self.bodies)
