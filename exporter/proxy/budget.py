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


class Budget:
    """Bytes that may be held at once, across connections; `held` is the current sum."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0

    def hold(self, size: int) -> Hold | None:
        """A hold of `size` bytes, or None when the budget cannot cover it."""
        hold = Hold(self)
        return hold if hold.grow(size) else None


class Hold:
    """Bytes held for one body or event. `release` gives them back (once, however often it is
    called), so a hold can be dropped by whichever end of a request comes first."""

    __slots__ = ("_budget", "size")

    def __init__(self, budget: Budget) -> None:
        self._budget = budget
        self.size = 0

    def grow(self, size: int) -> bool:
        """Hold `size` more bytes; False (and nothing more held) past the budget."""
        budget = self._budget
        if budget.held + size > budget.limit:
            return False
        budget.held += size
        budget.peak = max(budget.peak, budget.held)
        self.size += size
        return True

    def release(self) -> None:
        self._budget.held -= self.size
        self.size = 0
