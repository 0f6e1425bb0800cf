"""`specdec serve` out of file descriptors: idle clients have taken every descriptor the
process may open (RLIMIT_NOFILE below max_connections). New clients get a fast 503 (from a
descriptor kept in reserve), the accept loop does not spin (one log line per episode, little
CPU), and once clients leave, requests are answered again without a restart. Leaving, they can
run it short once more (the backlog still holds their closed connections): the same episode."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness.helpers import child, free_port, http_get, specdec, wait_for

LIMIT = 96  # descriptors the sidecar may open: ~40 at rest


@dataclass(frozen=True)
class Limited:
    """A sidecar run under LIMIT descriptors in front of a simulator: its ports, process, log."""

    proxy: int
    metrics: int
    proc: subprocess.Popen[bytes]
    log: Path

    def page(self) -> str:
        return http_get(f"http://127.0.0.1:{self.metrics}/metrics")

    @contextmanager
    def exhausted(self) -> Iterator[None]:
        """Idle clients holding twice LIMIT connections, until the sidecar has logged the
        episode; closed on the way out."""
        idle = [socket.create_connection(("127.0.0.1", self.proxy)) for _ in range(2 * LIMIT)]
        try:
            wait_for(lambda: "out of file descriptors" in self.log.read_text() or None,
                     what="the episode")  # fmt: skip
            yield
        finally:
            for sock in idle:
                sock.close()


@contextmanager
def limited_sidecar(tmp_path: Path) -> Iterator[Limited]:
    sim, proxy, metrics = free_port(), free_port(), free_port()
    config = tmp_path / "specdec.yaml"
    config.write_text(
        f"""listen: 127.0.0.1:{metrics}
targets:
  - {{url: "http://127.0.0.1:{sim}/metrics"}}
proxy:
  upstream: http://127.0.0.1:{sim}
  listen: 127.0.0.1:{proxy}
"""
    )
    lower = f"resource.setrlimit(resource.RLIMIT_NOFILE, ({LIMIT}, {LIMIT}))"
    limited = [
        sys.executable,
        "-c",
        f"import os, resource, sys; {lower}; os.execvp(sys.argv[1], sys.argv[1:])",
        *specdec("serve", "--config", str(config)),
    ]
    log = tmp_path / "serve.log"
    with (
        child(specdec("sim", "--listen", f"127.0.0.1:{sim}", "--speed", "50"), tmp_path / "s"),
        child(limited, log) as serve,
    ):
        found = Limited(proxy, metrics, serve, log)
        wait_for(found.page, what="the sidecar")
        # the two start side by side: on a busy machine the proxy can be up before its upstream
        wait_for(lambda: http_get(f"http://127.0.0.1:{sim}/health") is not None, what="the sim")
        yield found


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks


def status_line(sock: socket.socket, request: bytes) -> bytes:
    """Send `request` on an open connection: the status line of its answer."""
    sock.sendall(request)
    got = b""
    while b"\r\n" not in got:
        piece = sock.recv(4096)
        if not piece:
            break
        got += piece
    return got.split(b"\r\n", 1)[0]


def ask(port: int, timeout: float = 5.0) -> tuple[bytes, float]:
    """GET /v1/models on a fresh connection: the status line and how long it took."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        got = status_line(sock, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    return got, time.monotonic() - started


def request_on(sock: socket.socket) -> bytes:
    """A small completion on an open connection: the status line of its answer."""
    body = b'{"model": "sim-27b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}'
    return status_line(
        sock,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(body), body),
    )


def counter(page: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in page.splitlines() if line.startswith(name))


def test_out_of_descriptors_new_clients_get_a_fast_503_and_it_recovers(tmp_path: Path) -> None:
    with limited_sidecar(tmp_path) as serve:
        assert ask(serve.proxy)[0].startswith(b"HTTP/1.1 200")
        with serve.exhausted():
            before = cpu_seconds(serve.proc.pid)
            status, took = ask(serve.proxy)
            assert status.startswith(b"HTTP/1.1 503"), status
            assert took < 1.0, took
            started = time.monotonic()
            wait_for(lambda: time.monotonic() - started > 2 or None, timeout=5, what="2 s")
            spent = cpu_seconds(serve.proc.pid) - before
            assert spent < 0.5, f"{spent:.2f} s of CPU in 2 s out of descriptors: spinning"
        wait_for(lambda: ask(serve.proxy)[0].startswith(b"HTTP/1.1 200") or None, timeout=20,
                 what="answers again")  # fmt: skip
        wait_for(lambda: "file descriptors available again" in serve.log.read_text() or None,
                 timeout=10, what="the episode's end")  # fmt: skip
        page = serve.page()
    log = serve.log.read_text()
    assert log.count("out of file descriptors") == 1, log[-2000:]
    assert log.count("file descriptors available again") == 1, log[-2000:]
    assert counter(page, 'specdec_proxy_shed_requests_total{limit="descriptors"}') >= 1


def test_no_descriptor_for_the_upstream_is_a_503_not_an_engine_error(tmp_path: Path) -> None:
    """A client connected before the descriptors ran out sends its request after: the proxy
    cannot open the upstream socket. That is the proxy's shortage: 503 with Retry-After,
    counted as shed for `descriptors`, never as an upstream (engine) error; and once
    descriptors are free again the same client is answered, no restart."""
    with limited_sidecar(tmp_path) as serve:
        early = socket.create_connection(("127.0.0.1", serve.proxy), timeout=10)
        # the pool's idle upstream connections go after 4 s: the request must open a new one
        started = time.monotonic()
        wait_for(lambda: time.monotonic() - started > 4.5 or None, timeout=6, what="4.5 s")
        try:
            with serve.exhausted():
                status = request_on(early)
                assert status.startswith(b"HTTP/1.1 503"), status
        finally:
            early.close()

        def answered() -> bool:
            with socket.create_connection(("127.0.0.1", serve.proxy), timeout=10) as again:
                return request_on(again).startswith(b"HTTP/1.1 200")

        wait_for(lambda: answered() or None, timeout=20, what="answered again")
        page = serve.page()
    assert counter(page, "specdec_proxy_upstream_errors_total") == 0, page
    assert counter(page, 'specdec_proxy_shed_requests_total{limit="descriptors"}') >= 1
    assert "out of file descriptors for upstream connections" in serve.log.read_text()
