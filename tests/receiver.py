"""A `Receiver` for tests of the upstream client: it gathers one response."""

from __future__ import annotations

import asyncio

from exporter.proxy.framing import Head


class Gather:
    """Collects head, body and outcome; `full` makes `data` report a full client."""

    def __init__(self, full: bool = False) -> None:
        self.full = full
        self.got: Head | None = None
        self.parts: list[bytes] = []
        self.error: BaseException | None = None
        self.ended = asyncio.get_running_loop().create_future()

    def head(self, head: Head) -> None:
        self.got = head

    def data(self, data: bytes) -> bool:
        self.parts.append(data)
        return not self.full

    def end(self) -> None:
        self.ended.set_result(None)

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.ended.set_result(None)

    @property
    def body(self) -> bytes:
        return b"".join(self.parts)

    async def response(self) -> tuple[Head, bytes]:
        """The head and body once the response ended; its error if it failed."""
        await asyncio.wait_for(asyncio.shield(self.ended), 10)
        if self.error is not None:
            raise self.error
        assert self.got is not None
        return self.got, self.body
