"""Plaintext keys a process holds, with explicit invalidation and a time bound.

Other processes destroy keys (a forget, an epoch retired by the shredder); they tell this one by dropping names
(the LISTEN/NOTIFY channel for job events carries them), and `ttl_s` bounds how long a key a notification missed can
outlive its destruction here: keep it under the erasure horizon. Reads whose keys are cached keep working while the
key provider is down. Bounded: the least recently used keys go first past `capacity`.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

V = TypeVar("V")


class KeyCache(Generic[V]):
    def __init__(
        self, *, capacity: int = 100_000, ttl_s: float = 150.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if capacity < 1 or ttl_s <= 0:
            raise ValueError("a key cache needs room for one key and a positive time to live")
        self._capacity = capacity
        self._ttl_s = ttl_s
        self._clock = clock
        self._keys: OrderedDict[Hashable, tuple[float, V]] = OrderedDict()
        self._lock = threading.Lock()  # the engine process and provider threads may share one

    def get(self, name: Hashable) -> V | None:
        with self._lock:
            found = self._keys.get(name)
            if found is None:
                return None
            if found[0] <= self._clock():
                del self._keys[name]
                return None
            self._keys.move_to_end(name)
            return found[1]

    def put(self, name: Hashable, key: V, *, until: float | None = None) -> None:
        """Cached for the time to live, or until `until` (this cache's clock) if that is sooner: what was derived from
        another cached key expires with it (`expiry`)."""
        with self._lock:
            expires = self._clock() + self._ttl_s
            self._keys[name] = (expires if until is None else min(expires, until), key)
            self._keys.move_to_end(name)
            while len(self._keys) > self._capacity:
                self._keys.popitem(last=False)

    def expiry(self, name: Hashable) -> float | None:
        """When `name` expires (this cache's clock); None when it is not cached (never, dropped or expired)."""
        with self._lock:
            found = self._keys.get(name)
            return None if found is None or found[0] <= self._clock() else found[0]

    @property
    def ttl_s(self) -> float:
        return self._ttl_s

    @property
    def clock(self) -> Callable[[], float]:
        return self._clock

    def replace(self, name: Hashable, key: V) -> None:
        """A new value under its old expiry (a cover punctured here is no fresher for the leaves it did not touch)."""
        with self._lock:
            found = self._keys.get(name)
            if found is not None:
                self._keys[name] = (found[0], key)

    def drop(self, names: Iterable[Hashable]) -> None:
        with self._lock:
            for name in names:
                self._keys.pop(name, None)

    def clear(self) -> None:
        with self._lock:
            self._keys.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._keys)
