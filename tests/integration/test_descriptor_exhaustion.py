"""`specdec serve` out of file descriptors: idle clients have taken every descriptor the
process may open (RLIMIT_NOFILE below max_connections). New clients get a fast 503 (from a
descriptor kept in reserve), the accept loop does not spin (one log line per episode, little
CPU), and once clients leave, requests are answered again without a restart."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

from tests.helpers import child, free_port, http_get, specdec, wait_for

LIMIT = 96  # descriptors the sidecar may open: ~40 at rest


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks


def ask(port: int, timeout: float = 5.0) -> tuple[bytes, float]:
    """GET /v1/models on a fresh connection: the status line and how long it took."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        got = b""
        while b"\r\n" not in got:
            piece = sock.recv(4096)
            if not piece:
                break
            got += piece
    return got.split(b"\r\n", 1)[0], time.monotonic() - started


def test_out_of_descriptors_new_clients_get_a_fast_503_and_it_recovers(tmp_path: Path) -> None:
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
    with (
        child(specdec("sim", "--listen", f"127.0.0.1:{sim}", "--speed", "50"), tmp_path / "s"),
        child(limited, tmp_path / "serve.log") as serve,
    ):
        wait_for(lambda: http_get(f"http://127.0.0.1:{metrics}/metrics"), what="the sidecar")
        assert ask(proxy)[0].startswith(b"HTTP/1.1 200")
        idle = [socket.create_connection(("127.0.0.1", proxy)) for _ in range(2 * LIMIT)]
        try:
            wait_for(lambda: "out of file descriptors" in (tmp_path / "serve.log").read_text()
                     or None, what="the episode")  # fmt: skip
            before = cpu_seconds(serve.pid)
            status, took = ask(proxy)
            assert status.startswith(b"HTTP/1.1 503"), status
            assert took < 1.0, took
            started = time.monotonic()
            wait_for(lambda: time.monotonic() - started > 2 or None, timeout=5, what="2 s")
            spent = cpu_seconds(serve.pid) - before
            assert spent < 0.5, f"{spent:.2f} s of CPU in 2 s out of descriptors: spinning"
        finally:
            for sock in idle:
                sock.close()
        wait_for(lambda: ask(proxy)[0].startswith(b"HTTP/1.1 200") or None, timeout=20,
                 what="answers again")  # fmt: skip
        page = http_get(f"http://127.0.0.1:{metrics}/metrics")
    log = (tmp_path / "serve.log").read_text()
    assert log.count("out of file descriptors") == 1, log[-2000:]
    assert "file descriptors available again" in log
    counter = 'specdec_proxy_shed_requests_total{limit="descriptors"}'
    shed = next(line for line in page.splitlines() if line.startswith(counter))
    assert float(shed.split()[-1]) >= 1
