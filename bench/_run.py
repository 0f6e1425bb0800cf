"""How every benchmark script runs: signals unwind through its cleanup, errors exit 1."""

from __future__ import annotations

import argparse
import signal
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
