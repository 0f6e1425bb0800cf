"""The real servers' processes, for the tests and the bench alike: their addresses, whether one
answers its health check, and ending one (politely first)."""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request


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
