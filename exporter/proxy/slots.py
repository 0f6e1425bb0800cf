"""At max_connections: which connection gives its slot to a new one, if any may.

Why not "the one idle longest": a connection just accepted looks idle until its first bytes
are read, even when its whole request already sits in the kernel's buffer, and closing it then
resets the client after it sent its request (a lost request: a client cannot know whether a
cut POST ran). So a connection gives its slot only when no request is under way on it, checked
at the moment of choosing: not being answered, no bytes of a request read, and none waiting in
the kernel. In this order:

1. a keep-alive connection between requests, idle for IDLE_GRACE at least, the longest first;
2. a request head arriving under MIN_HEAD_RATE for over a second (answered 408), the longest;
3. a new connection that has sent nothing for FIRST_BYTES (answered 503 before its close, so a
   request that crosses the close is refused whole), the oldest first;
4. a keep-alive connection idle for less (its client may be about to send: last of the idle);
5. when the address holding the most slots holds more than one more than the newcomer's: one
   of its new connections that has sent nothing yet (503) or a head arriving (408), the oldest.

None: the newcomer is the one refused (a whole 503). FIRST_BYTES is the grace a client has for
its request after connecting, short so that a peer that only opens connections cannot keep
every slot young (each of its connections is free for the taking after it); rule 5 makes a
peer that holds most of the slots give them to the others first, so one address, however it
churns or trickles, cannot deny service to another. Behind a gateway every client shares one
address, and rules 1-4 alone apply.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from exporter.proxy.connection import ClientConnection

IDLE_GRACE = 1.0  # seconds: a keep-alive connection idle for less goes after the others
FIRST_BYTES = 0.25  # seconds a new connection has for its first bytes before it may go
_ORDER = {"kept": 0, "slow_head": 1, "fresh": 2}  # rules 1-3 (rule 4: "kept", young)


def choose(
    clients: Iterable[ClientConnection], peer: str, now: float
) -> tuple[ClientConnection, str] | None:
    """The connection that gives its slot to a new one from `peer`, and what it was doing
    (its `Use.kind`); None when none may (see above)."""
    ranked: list[tuple[int, float, ClientConnection, str]] = []
    hoarded: list[tuple[float, ClientConnection, str]] = []  # rule 5's, of every address
    held: Counter[str] = Counter()
    for client in clients:
        held[client.peer] += 1
        use = client.use(now)
        if use is None:
            continue
        kind, since = use
        if kind == "kept":
            ranked.append((0 if now - since >= IDLE_GRACE else 3, since, client, kind))
        elif kind == "slow_head" or (kind == "fresh" and now - since >= FIRST_BYTES):
            ranked.append((_ORDER[kind], since, client, kind))
        else:  # a head arriving at a fair rate, or a new connection in its grace
            hoarded.append((since, client, kind))
    ranked.sort(key=lambda entry: entry[:2])
    for _, _, client, kind in ranked:
        if not client.unread():
            return client, kind
    if not held:
        return None
    top, most = held.most_common(1)[0]
    if top == peer or most <= held[peer] + 1:
        return None
    for _, client, kind in sorted((e for e in hoarded if e[1].peer == top), key=lambda e: e[0]):
        if not client.unread():
            return client, kind
    return None
