"""An LRU of resident KV caches bounded by a memory budget in bytes.

The pool holds its members weakly: a handle the caller dropped without `release` frees its cache with it, and the
pool forgets the dead entry at its next pass. Evicting a member only drops its tensors; the member keeps what it
needs to rebuild them, so eviction costs time, never correctness. Not thread-safe: the engine calls it from its one
worker thread.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Generic, Protocol, TypeVar


class Evictable(Protocol):
    @property
    def serial(self) -> int: ...

    @property
    def nbytes(self) -> int: ...

    def evict(self) -> None: ...


M = TypeVar("M", bound=Evictable)


class CachePool(Generic[M]):
    def __init__(self, budget: int) -> None:
        if budget < 0:
            raise ValueError("the memory budget must be >= 0 bytes")
        self.budget = budget
        self._entries: OrderedDict[int, tuple[weakref.ref[M], int]] = OrderedDict()
        self._pinned: dict[int, int] = {}  # serial -> pins: members a paused call still needs (never evicted)

    @property
    def total_bytes(self) -> int:
        return sum(nbytes for ref, nbytes in self._entries.values() if ref() is not None)

    def __len__(self) -> int:
        return sum(1 for ref, _ in self._entries.values() if ref() is not None)

    def touch(self, member: M) -> None:
        """Record `member` as the most recently used, at its current size."""
        self._entries[member.serial] = (weakref.ref(member), member.nbytes)
        self._entries.move_to_end(member.serial)

    def drop(self, member: M) -> None:
        self._entries.pop(member.serial, None)

    def pin(self, member: M) -> None:
        """Keep `member` resident until `unpin`, whatever the budget (a generation paused for more urgent work)."""
        self._pinned[member.serial] = self._pinned.get(member.serial, 0) + 1

    def unpin(self, member: M) -> None:
        left = self._pinned.get(member.serial, 0) - 1
        if left > 0:
            self._pinned[member.serial] = left
        else:
            self._pinned.pop(member.serial, None)

    def evict_over_budget(self, keep: M | None = None) -> int:
        """Evict least recently used members until the total fits the budget; `keep` (in use now) and pinned members
        stay even if they alone exceed it. Returns how many were evicted."""
        evicted = 0
        total = 0
        for serial, (ref, nbytes) in list(self._entries.items()):
            if ref() is None:
                del self._entries[serial]
            else:
                total += nbytes
        for serial, (ref, nbytes) in list(self._entries.items()):
            if total <= self.budget:
                break
            member = ref()
            if member is None or member is keep or serial in self._pinned:
                continue
            del self._entries[serial]
            member.evict()
            total -= nbytes
            evicted += 1
        return evicted

    def evict_all(self) -> None:
        for ref, _ in self._entries.values():
            member = ref()
            if member is not None:
                member.evict()
        self._entries.clear()
