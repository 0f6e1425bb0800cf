"""Shared test helpers: free ports, polling with a deadline, child processes, real tools."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn, TypeVar

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"  # the recorded pages
T = TypeVar("T")


_HANDED_OUT: set[int] = set()
_PICK = random.Random()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing holds, from below the kernel's ephemeral range and
    never the same twice in a run. A port the kernel picks (bind to 0) is one it may hand the
    next outgoing connection before the test binds it: CI saw EADDRINUSE after a test's 1000
    client connections."""
    low = _ephemeral_low()
    for _ in range(1000):
        port = _PICK.randrange(20000, low) if low > 22000 else 0
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            port = int(s.getsockname()[1])
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free port below the ephemeral range")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def wait_for(check: Callable[[], T | None], timeout: float = 20.0, what: str = "condition") -> T:
    """Poll `check` until it returns something truthy; fail with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # the thing polled may not be up yet
            last_error = exc
        time.sleep(0.05)
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what} (last error: {last_error})"
    )


async def until(check: Callable[[], object], timeout: float = 10.0) -> None:
    """Poll a plain predicate from inside the event loop until it holds, with a deadline."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s")
        await asyncio.sleep(0.01)


async def eventually(check: Callable[[], Awaitable[T | None]], timeout: float) -> T:
    """The async `wait_for`: await `check` until it returns something truthy, with a deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s")
        await asyncio.sleep(0.05)


def http_get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return str(resp.read().decode())


def need_tool(name: str) -> str:
    """Path of a real component, preferring the one pip installed next to this interpreter (the
    test extra) over anything else on PATH (e.g. a distribution's older kubectl); in CI its
    absence is a failure, locally a skip."""
    for directory in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed; .ci/run must install it")
        pytest.skip(f"{name} not installed")
    return path


def unavailable(reason: str) -> NoReturn:
    """In CI a real part that cannot be had is a failure; on a laptop, a skip."""
    if os.environ.get("CI"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@contextmanager
def child(
    args: list[str], log: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run a child process in its own group; on exit stop the whole group (no orphans)."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        try:
            yield proc
        finally:
            stop_group(proc)


def stop_group(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def specdec(*args: str) -> list[str]:
    return [sys.executable, "-m", "exporter", *args]


def scenario_pack(directory: Path, prompts: int, longer: int = 0) -> Path:
    """The first `prompts` prompts of each built-in pack with a 120-token cap, as a
    --scenario-file: the same workloads, a shorter run; `longer`: with about that many words
    of context more (`Scenario.lengthened`)."""
    import json

    from exporter.measure.scenarios import builtin

    lines = []
    for name in ("ja_chat", "code_agent"):
        s = builtin(name).lengthened(longer) if longer else builtin(name)
        pack = {
            "name": name,
            "max_tokens": 120,
            "system": s.system,
            "prompts": list(s.prompts[:prompts]),
        }
        lines.append(json.dumps(pack, ensure_ascii=False))
    path = directory / "pack.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
