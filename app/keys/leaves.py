"""Handing out leaves: numbers never reused, in blocks per stream so an erasure unit's neighbours share a path.

A tenant's counter lives in its database row; `reserve(tenant, n)` (a repository's `UPDATE ... SET next_leaf =
next_leaf + n RETURNING`) takes `n` numbers from it for good. This process then hands them out to one stream at a
time (a session, a memory namespace), so a session's artifacts sit on consecutive leaves and a forget's closure,
a suffix of the session, punctures runs of neighbours: small covers (`tree`). Numbers a process reserved and never
handed out (it stopped, a stream went cold) are skipped, never reused: there are 2^63 of them.

A stream's first block is small and each next one twice the last, up to `most`: a stream that keeps writing (a
LangGraph thread's checkpoints, two leaves a put) reserves a logarithmic number of times instead of once every few
writes, each reservation a transaction of its own, while a stream written once skips at most its first block.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable

Reserve = Callable[[str, int], Awaitable[int]]  # (tenant, how many) -> the first of them


class Leaves:
    def __init__(self, reserve: Reserve, *, block: int = 16, most: int = 1024, streams: int = 10_000) -> None:
        if block < 1 or most < block or streams < 1:
            raise ValueError("a block holds a leaf, `most` one block at least, and one stream at least is remembered")
        self._reserve = reserve
        self._block = block
        self._most = most
        self._streams = streams
        # -> (next, end, the size of the block they come from)
        self._open: OrderedDict[tuple[str, Hashable], tuple[int, int, int]] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}

    async def next(self, tenant: str, stream: Hashable) -> int:
        """A leaf no one else ever gets."""
        lock = self._locks.setdefault(tenant, asyncio.Lock())
        async with lock:
            name = (tenant, stream)
            found = self._open.pop(name, None)
            if found is None or found[0] == found[1]:
                size = self._block if found is None else min(2 * found[2], self._most)
                first = await self._reserve(tenant, size)
                found = (first, first + size, size)
            self._open[name] = (found[0] + 1, found[1], found[2])
            while len(self._open) > self._streams:  # the coldest stream's rest is skipped
                self._open.popitem(last=False)
            return found[0]
