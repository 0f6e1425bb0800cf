"""The real servers' processes, for the tests and the bench alike: their addresses, whether one
answers its health check, ending one (politely first), and one builder at a time per cache."""

from __future__ import annotations

import fcntl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class Listening:
    """A server on 127.0.0.1:`port`, and its URLs."""

    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.base_url}/metrics"


def healthy(base_url: str) -> bool:
    """Whether GET `base_url`/health answers 200 (a server still loading does not answer)."""
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def terminate(proc: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    """SIGTERM, SIGKILL after `grace` s where it has not ended; returns once it has."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def building(cache_dir: Path) -> Iterator[None]:
    """Hold `cache_dir`'s build lock: test workers and CI's head start (`harness.prepare`) build
    a cache once between them; a second builder waits for the first, then finds it built."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    with (cache_dir / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
