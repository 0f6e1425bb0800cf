"""How every benchmark script runs: signals unwind through its cleanup, errors exit 1; its
child processes die with it; the sidecar config the proxy benchmarks share."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"  # a file per recorded run: its commit, command, figures


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


def revision(repo: Path) -> str:
    """The commit measured, and whether exporter/ differs from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "exporter"],
            cwd=repo,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return f"{head or 'unknown'}{' (exporter/ modified)' if dirty else ''}"


def record(
    bench: str, figures: dict[str, Any], notes: str | None = None, into: Path = RESULTS
) -> Path:
    """Keep one run's figures as data: bench/results/<bench>-<UTC time>-<commit>.json, with
    the commit, the command line and the machine beside them (`python3 bench/render.py` makes
    the tables of them)."""
    now = datetime.datetime.now(datetime.UTC)
    commit = revision(REPO)
    into.mkdir(parents=True, exist_ok=True)
    path = into / f"{bench}-{now:%Y%m%dT%H%M%SZ}-{commit.split()[0]}.json"
    run: dict[str, Any] = {
        "bench": bench,
        "commit": commit,
        "command": " ".join(["python3", *sys.argv]),
        "started_utc": now.isoformat(timespec="seconds"),
        "machine": machine(),
        "figures": figures,
    }
    if notes:
        run["notes"] = notes
    path.write_text(json.dumps(run, indent=1) + "\n")
    return path


def machine() -> dict[str, Any]:
    """What the figures were measured on: CPUs, interpreter, kernel, and how busy it was."""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()} {platform.machine()}",
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def add_outputs(parser: argparse.ArgumentParser, json_file: bool = True) -> None:
    """The flags that keep a bench's figures: --json FILE (just the figures) and --record (a
    result file in bench/results/, with commit, command and machine)."""
    if json_file:
        parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument(
        "--record",
        action="store_true",
        help="keep the figures in bench/results/ with the commit, command and machine",
    )


def keep(args: argparse.Namespace, bench: str, figures: dict[str, Any]) -> None:
    """Write what `add_outputs`' flags asked for."""
    if getattr(args, "json", None):
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    if getattr(args, "record", False):
        print("recorded:", record(bench, figures))


TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
READY_DEADLINE = 30.0


def spawn(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
            cwd=REPO,
        )


def wait_http(proc: subprocess.Popen[bytes], url: str) -> None:
    deadline = time.monotonic() + READY_DEADLINE
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: its server exited at start (code {proc.returncode})")
        with contextlib.suppress(OSError):
            urllib.request.urlopen(url, timeout=1).close()
            return
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready within {READY_DEADLINE:.0f} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def proc_stats(pid: int) -> tuple[float, int, float]:
    """RSS in MB, open fds, CPU seconds (user + system) of one process."""
    with open(f"/proc/{pid}/statm") as f:
        rss = int(f.read().split()[1]) * PAGE / 1e6
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return rss, fds, (int(fields[11]) + int(fields[12])) / TICKS


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
