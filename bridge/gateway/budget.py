"""The gateway's in-flight byte budget: one per gateway, shared by all its connections, so what
the sandbox (or an upstream) sends is held in the runner's memory only up to a fixed total
however many connections there are and however large their bodies.

Whoever holds bytes takes a grant first and gives it back once the bytes are passed on. A grant
is taken only when there is something to read (a connection that is idle holds nothing), and
each holder takes one grant at a time and never waits for a second while holding the first, so
waiting holders cannot deadlock: they are served in arrival order as grants come back."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class ByteBudget:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.free = capacity
        self.peak = 0  # most bytes granted at once, for the benchmark and tests
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    def _size(self, nbytes: int) -> int:
        return max(1, min(nbytes, self.capacity))  # a grant never exceeds the whole budget

    async def take(self, nbytes: int) -> int:
        """Wait until ``nbytes`` (at most the capacity) are free and take them; returns the
        amount taken, which the caller gives back."""
        size = self._size(nbytes)
        if not self._waiting and self.free >= size:
            self._grant(size)
            return size
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((size, future))
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():
                self.give(size)  # granted just as the wait was cancelled: hand it on
            else:
                try:
                    self._waiting.remove((size, future))
                except ValueError:
                    pass  # already passed over by _wake
                self._wake()
            raise
        return size

    def give(self, nbytes: int) -> None:
        self.free += nbytes
        self._wake()

    def _grant(self, size: int) -> None:
        self.free -= size
        self.peak = max(self.peak, self.capacity - self.free)

    def _wake(self) -> None:
        # First come, first served: a large grant at the head is not overtaken by small ones.
        while self._waiting and self._waiting[0][0] <= self.free:
            size, future = self._waiting.popleft()
            if future.done():
                continue
            self._grant(size)
            future.set_result(None)

    @asynccontextmanager
    async def hold(self, nbytes: int) -> AsyncIterator[int]:
        size = await self.take(nbytes)
        try:
            yield size
        finally:
            self.give(size)
