"""The key cache: explicit invalidation, a time bound for what a notification missed, and a size bound."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.keys.cache import KeyCache
from app.keys.envelope import Binding
from app.keys.errors import Erased
from app.keys.keyring import Keyring
from app.keys.local import LocalProvider


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_time_bound_drop_and_size_bound() -> None:
    clock = Clock()
    cache: KeyCache[bytes] = KeyCache(capacity=2, ttl_s=10, clock=clock)
    cache.put("a", b"1")
    cache.put("b", b"2")
    assert cache.get("a") == b"1"  # "a" is now the most recently used
    cache.put("c", b"3")
    assert cache.get("b") is None and cache.get("a") == b"1" and cache.get("c") == b"3"
    cache.drop(["c"])
    assert cache.get("c") is None
    clock.now += 10
    assert cache.get("a") is None and len(cache) == 0
    with pytest.raises(ValueError):
        KeyCache(capacity=0)


def test_a_missed_notification_is_bounded_by_the_ttl(tmp_path: Path) -> None:
    """Process B cached a key; process A shreds it. B derives it until told (`forget_cached`) or until its ttl."""
    clock = Clock()
    keys = tmp_path / "keys"
    other = Keyring(LocalProvider(keys), ttl_s=60, clock=clock)
    here = Binding("ten_a", "artifacts", "art_3", "text")
    sealed = asyncio.run(other.seal(3, here, b"target"))
    key = asyncio.run(other.key("ten_a", 3))
    asyncio.run(Keyring(LocalProvider(keys)).shred("ten_a", [3]))
    assert asyncio.run(other.key("ten_a", 3)) == key  # stale, within the bound the docs state
    assert asyncio.run(other.unseal(here, sealed)) == b"target"
    clock.now += 60
    with pytest.raises(Erased):
        asyncio.run(other.key("ten_a", 3))
    with pytest.raises(Erased):
        asyncio.run(other.unseal(here, sealed))

    told = Keyring(LocalProvider(keys), ttl_s=60, clock=clock)
    asyncio.run(told.key("ten_a", 4))
    asyncio.run(Keyring(LocalProvider(keys)).shred("ten_a", [4]))
    told.forget_cached("ten_a", [4])
    with pytest.raises(Erased):
        asyncio.run(told.key("ten_a", 4))
