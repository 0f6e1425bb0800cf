"""One memory budget for every byte the proxy holds on behalf of a peer.

Why one budget and not a limit per connection: a limit per connection times the connections
allowed is far more than a pod has (16 MiB x 1024). What the proxy must hold to do its job (a
request body until routing has read it and the upstream has taken it, a whole response until
accounting has read it, an SSE event until it is complete) is taken from one pool of
`proxy.max_buffered_bytes`; a request that cannot get its share is answered 503 with a
Retry-After before its body is read, a response that cannot is relayed without being read.
So the process's memory is bounded by its baseline, the budget and a small cost per
connection, whatever peers send (docs/operations.md has the formula).
"""

from __future__ import annotations

from typing import Protocol

SMALL = 1 << 20  # a hold of at most this many bytes (a completion request, a response, an
# SSE event) may use the reserve; a larger one (a large upload) may not
STALL = 1.0  # seconds without a body byte after which an upload gives way under pressure


class Upload(Protocol):
    """A request body still being received, whose hold may be taken back under pressure."""

    def stalled_for(self) -> float:
        """Seconds since its last byte (0 while bytes keep coming)."""

    def evict(self) -> None:
        """Give its hold back now (the client gets a 408 and the connection closes)."""


class Budget:
    """Bytes that may be held at once, across connections; `held` is the current sum.

    Admission that no handful of peers can turn into a denial of service: `reserve` bytes of
    the budget are for holds of at most SMALL bytes, so uploads of max_body_bytes, however
    many and however slow, leave room for ordinary completion requests; and when a hold does
    not fit, uploads that have sent nothing for STALL seconds give theirs back (408), the
    longest stalled first. The bound on memory is the same `limit`."""

    def __init__(self, limit: int, reserve: int = 0) -> None:
        self.limit = limit
        self.reserve = reserve
        self.held = 0
        self.peak = 0
        self.uploads: set[Upload] = set()  # bodies being received: what may give way
        self.stall = STALL

    def hold(self, size: int) -> Hold | None:
        """A hold of `size` bytes, or None when the budget cannot cover it."""
        hold = Hold(self)
        return hold if hold.grow(size) else None

    def room(self, total: int) -> int:
        """Bytes a hold that would then be `total` bytes may take the budget up to."""
        return self.limit if total <= SMALL else self.limit - self.reserve

    def make_room(self, size: int, room: int) -> bool:
        """Take holds back from stalled uploads, the longest stalled first, until `size` more
        bytes fit under `room`; whether they do now."""
        stalled = sorted(
            ((s, u) for u in self.uploads if (s := u.stalled_for()) >= self.stall),
            key=lambda pair: pair[0],
            reverse=True,
        )
        for _, upload in stalled:
            if self.held + size <= room:
                break
            self.uploads.discard(upload)
            upload.evict()
        return self.held + size <= room


class Hold:
    """Bytes held for one body or event. `release` gives them back (once, however often it is
    called), so a hold can be dropped by whichever end of a request comes first."""

    __slots__ = ("_budget", "size")

    def __init__(self, budget: Budget) -> None:
        self._budget = budget
        self.size = 0

    def grow(self, size: int) -> bool:
        """Hold `size` more bytes; False (and nothing more held) past the budget: past its
        reserve for a hold that would exceed SMALL, even after stalled uploads gave way."""
        budget = self._budget
        room = budget.room(self.size + size)
        if budget.held + size > room and not budget.make_room(size, room):
            return False
        budget.held += size
        budget.peak = max(budget.peak, budget.held)
        self.size += size
        return True

    def release(self) -> None:
        self._budget.held -= self.size
        self.size = 0
