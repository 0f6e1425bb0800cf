"""The proxy's accept loop, which stays up when the process runs out of file descriptors.

Why not the event loop's own server: when accept() fails with EMFILE or ENFILE, uvloop tries
again at once (seen: ~25,000 log lines in a few seconds, half a core) and asyncio logs a
traceback and waits; either way the new client's connection waits in the backlog with no
answer until other clients leave. Here one descriptor is kept in reserve: when accept() fails
for want of descriptors, the reserve is closed, the waiting connection accepted, answered 503
with a Retry-After (vLLM's shape) and closed, the reserve taken again, for every connection
waiting; the episode is logged once when it starts and once when it ends, with its count.
Recovery needs no restart: accept() succeeding with no shortage for `RECOVERED` seconds ends
the episode. Not the first success alone: as clients leave, the backlog still holds their
closed connections, and accepting those can run short again before the proxy has closed its
side of the idle ones (seen: 'available again' and a new episode 1 ms apart).

The proxy may also `hold` accepting (its sockets being closed are at their bound): new clients
wait in the listen backlog, at no cost, until it lets go.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
from collections.abc import Callable
from functools import partial

from structlog.stdlib import BoundLogger

from exporter.proxy.responses import closing

EXHAUSTED = {errno.EMFILE: "emfile", errno.ENFILE: "enfile"}
PER_WAKE = 64  # connections taken per readiness event: the loop's other work goes on between
BACKOFF = (0.05, 1.0)  # seconds: when not even the reserve helps, accept() is paused this long
RECOVERED = 1.0  # seconds of accept() with no shortage that end an episode
SHED = closing(503, "the proxy is out of file descriptors")


class Listener:
    """Accepts connections on one listening socket and hands each to `protocol(peer)`, the
    client's address."""

    def __init__(
        self,
        protocol: Callable[[str], asyncio.Protocol],
        shed: Callable[[str], None],
        log: BoundLogger,
    ) -> None:
        self._protocol = protocol
        self._shed = shed  # told each connection answered 503 for want of descriptors
        self._log = log
        self._sock: socket.socket | None = None
        self._reserve: int | None = None
        self._short_since: float | None = None  # when the episode under way began
        self._short_last = 0.0  # when accept() last ran short
        self._ok_last = 0.0  # when accept() last succeeded
        self._episode = 0  # connections shed in the episode under way
        self._ending: asyncio.TimerHandle | None = None  # the check that may end it
        self._backoff = BACKOFF[0]
        self._backing_off = False  # accept() paused for want of even the reserve
        self._held = False  # accept() paused by the proxy (`hold`)
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, host: str, port: int) -> None:
        """Take the address now, accepting nothing yet: an address another process took fails
        here, before the process serves anything else (its /metrics)."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as create_server
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        self._sock = sock

    def start(self, backlog: int = 1024) -> None:
        """Accept on the bound address."""
        assert self._sock is not None, "bind() first"
        self._loop = asyncio.get_running_loop()
        self._sock.listen(backlog)
        self._sock.setblocking(False)
        self._reserve = os.open(os.devnull, os.O_RDONLY)
        self._loop.add_reader(self._sock.fileno(), self._readable)

    def hold(self, held: bool) -> None:
        """Pause accepting (True) or go on (False); connections wait in the backlog meanwhile."""
        if held == self._held or self._sock is None or self._loop is None:
            self._held = held
            return
        self._held = held
        if held:
            self._loop.remove_reader(self._sock.fileno())
        elif not self._backing_off:
            self._loop.add_reader(self._sock.fileno(), self._readable)

    def close(self) -> None:
        if self._ending is not None:
            self._ending.cancel()
            self._ending = None
        if self._sock is not None:  # bound, perhaps never started
            if self._loop is not None:
                self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None

    def _readable(self) -> None:
        sock, loop = self._sock, self._loop
        assert sock is not None and loop is not None
        for _ in range(PER_WAKE):
            try:
                conn, address = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in EXHAUSTED:
                    self._exhausted(EXHAUSTED[exc.errno])
                    return
                continue  # ECONNABORTED and the like: that client is gone, the next one waits
            self._backoff, self._ok_last = BACKOFF[0], loop.time()
            if self._short_since is not None and self._ending is None:
                self._ending = loop.call_later(RECOVERED, self._maybe_recovered)
            conn.setblocking(False)
            peer = str(address[0]) if isinstance(address, tuple) else ""
            loop.create_task(loop.connect_accepted_socket(partial(self._protocol, peer), conn))

    def _exhausted(self, reason: str) -> None:
        """Answer every waiting connection 503 through the reserved descriptor; pause accept()
        for a while when even that cannot be done."""
        sock, loop = self._sock, self._loop
        assert sock is not None and loop is not None
        self._short_last = loop.time()
        if self._short_since is None:
            self._short_since = self._short_last
            self._log.warning("out of file descriptors: new connections get 503", reason=reason)
        while self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                break  # nobody is waiting any more
            except OSError:
                break
            else:
                with conn, contextlib.suppress(OSError):
                    conn.send(SHED)  # fits a socket buffer: sent at once or not at all
                self._episode += 1
                self._shed(reason)
            finally:
                self._reserve = self._take_reserve()
        if self._reserve is None:  # the descriptor was taken meanwhile: back off and retry
            loop.remove_reader(sock.fileno())
            self._backing_off = True
            loop.call_later(self._backoff, self._resume)
            self._backoff = min(self._backoff * 2, BACKOFF[1])

    def _maybe_recovered(self) -> None:
        """End the episode if accept() has succeeded since it last ran short, and has not run
        short for `RECOVERED` seconds; else look again when it will have (or at the next
        success)."""
        assert self._loop is not None and self._short_since is not None
        self._ending = None
        if self._ok_last < self._short_last:
            return  # short again, and nothing accepted since: the next success looks again
        now = self._loop.time()
        left = self._short_last + RECOVERED - now
        if left > 0:
            self._ending = self._loop.call_later(left, self._maybe_recovered)
            return
        lasted = round(self._short_last - self._short_since, 3)
        self._log.warning("file descriptors available again", shed=self._episode, lasted_s=lasted)
        self._short_since, self._episode = None, 0

    def _take_reserve(self) -> int | None:
        try:
            return os.open(os.devnull, os.O_RDONLY)
        except OSError:
            return None

    def _resume(self) -> None:
        self._backing_off = False
        if self._sock is None or self._loop is None:
            return
        if self._reserve is None:
            self._reserve = self._take_reserve()
        if not self._held:
            self._loop.add_reader(self._sock.fileno(), self._readable)
