"""What every long-running verb does the same way: check its listen addresses before anything
starts, run on uvloop when it is installed (and say what it runs on: `Runtime`), and stop
cleanly on SIGINT, SIGTERM and SIGHUP (what Ctrl-C, `timeout`, systemd, `docker stop` and a
closed terminal send), exiting 0. A verb with requests in flight asks for a `graceful` stop
once it runs: the first signal drains, a second one stops at once."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import importlib.metadata
import platform
import signal
import socket
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class AddressInUse(Exception):
    """A listen address another process holds: `str()` is the one line to print."""


def check_free(addresses: Sequence[tuple[str, int, str]]) -> None:
    """Raise AddressInUse for the first (host, port, where) that cannot be bound; `where`
    names the flag or config key that sets it. Bound as asyncio's servers bind (SO_REUSEADDR),
    so a port in TIME_WAIT is not mistaken for a busy one."""
    for host, port, where in addresses:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as exc:
                shown = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
                if exc.errno == errno.EADDRINUSE:
                    raise AddressInUse(
                        f"{shown} is already in use ({where}); stop what holds it or pick another"
                    ) from None
                raise AddressInUse(f"cannot listen on {shown} ({where}): {exc.strerror}") from None


def return_freed_memory() -> None:
    """glibc raises its mmap threshold each time a large block is freed, so after a burst of
    large bodies their memory stays in the heap, counted in RSS, until the process ends. A
    fixed threshold (128 KiB) gives every large block its own mapping, returned to the system
    when it is freed: a proxy's RSS falls back after hostile uploads end. No-op off glibc."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
        libc.mallopt(m_mmap_threshold, 128 * 1024)
        libc.mallopt(m_trim_threshold, 128 * 1024)


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed (a dependency wherever it ships wheels: Linux and macOS on
    CPython): the proxy's cost is mostly per-chunk socket writes, which uvloop's C transport
    does in a fraction of asyncio's time."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


@dataclass(frozen=True, slots=True)
class Runtime:
    """What the process runs on, as the start log and `specdec_runtime_info` say it: a slow
    install (asyncio's own loop) shows on the sidecar's own page."""

    event_loop: str  # "uvloop" or "asyncio"
    event_loop_version: str
    http_parser: str  # the proxy's request parser: httptools (llhttp)
    http_parser_version: str
    python: str

    @classmethod
    def current(cls) -> Runtime:
        """The running loop's (outside one: the loop the verbs run on)."""
        try:
            fast = type(asyncio.get_running_loop()).__module__.split(".")[0] == "uvloop"
        except RuntimeError:
            fast = loop_factory() is not None
        return cls(
            "uvloop" if fast else "asyncio",
            _version("uvloop") if fast else platform.python_version(),
            "httptools",
            _version("httptools"),
            platform.python_version(),
        )


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def run_until_stopped(
    main: Callable[[], Coroutine[Any, Any, T]], signals: Sequence[signal.Signals] = STOP_SIGNALS
) -> T | None:
    """Run `main()` until it returns (its result) or one of `signals` arrives; then it is
    cancelled (None), so its `finally` blocks stop servers, end children and remove temp files
    before this returns."""

    async def guarded() -> T | None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in signals:
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            return await main()
        return None

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(guarded())


def graceful(
    task: asyncio.Task[Any], signals: Sequence[signal.Signals] = STOP_SIGNALS
) -> asyncio.Event:
    """From now on the first of `signals` sets the returned event (the caller drains, then
    returns) and a second one cancels `task` (stop now, as before). Replaces the handlers
    `run_until_stopped` set for those signals."""
    loop = asyncio.get_running_loop()
    requested = asyncio.Event()

    def on_signal() -> None:
        if requested.is_set():
            task.cancel()
        else:
            requested.set()

    for sig in signals:
        loop.add_signal_handler(sig, on_signal)
    return requested
