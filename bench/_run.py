"""How every benchmark script runs: signals unwind through its cleanup, errors exit 1; its
child processes die with it; the sidecar config the proxy benchmarks share."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import signal
import socket
import sys
from collections.abc import Callable


def guarded(name: str, run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run `run(args)`; SIGTERM/SIGHUP raise SystemExit so its `finally` stops the children."""

    def on_signal(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        return run(args)
    except RuntimeError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130


def die_with_parent() -> None:
    """In the child (preexec_fn): get SIGTERM when the script dies, even by SIGKILL (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# `specdec serve` in front of a simulator: voice_chat by header, coding_agent by path prefix
SIDECAR_CONF = """\
listen: 127.0.0.1:{metrics}
targets:
  - name: sim
    url: http://127.0.0.1:{upstream}/metrics
proxy:
  listen: 127.0.0.1:{port}
  upstream: http://127.0.0.1:{upstream}
  target: sim
  routes:
    - name: voice_chat
      when: {{header: {{X-Route: voice}}}}
    - name: coding_agent
      when: {{path_prefix: /agent}}
  default_route: other
models:
  - name: {model}
    num_speculative_tokens: 3
    step_cost_ratio: 1.78
"""
