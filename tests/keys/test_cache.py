"""The key cache: explicit invalidation, a time bound for what a notification missed, and a size bound; what a
process opened under a key is held no longer than the key."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from app.keys.cache import KeyCache
from app.keys.content import Sealer
from app.keys.envelope import Binding
from app.keys.errors import Erased
from app.keys.keyring import Keyring
from app.keys.leaves import Leaves
from app.keys.local import LocalProvider
from app.keys.provider import Cover


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
    clock.now += 5
    cache.replace("a", b"1'")  # keeps its expiry
    cache.replace("gone", b"x")  # replaces nothing that is not there
    assert cache.get("a") == b"1'" and cache.get("gone") is None
    clock.now -= 5
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


class _GatedOnce(LocalProvider):
    """Its first read parks after reading the file until the test releases it (a read in flight)."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.reached, self.release = threading.Event(), threading.Event()

    def read(self, tenant: str, shard: int) -> Cover | None:
        cover = super().read(tenant, shard)
        if not self.reached.is_set():
            self.reached.set()
            self.release.wait()
        return cover


def test_a_read_in_flight_during_a_shred_does_not_cache_the_old_cover(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    key = asyncio.run(Keyring(LocalProvider(keys)).key("ten_a", 3))  # the shard exists
    provider = _GatedOnce(keys)
    keyring = Keyring(provider)

    async def race() -> bytes:
        reader = asyncio.create_task(keyring.key("ten_a", 3))  # reads the cover from before the shred, parks
        await asyncio.to_thread(provider.reached.wait)
        await keyring.shred("ten_a", [3])
        provider.release.set()
        return await reader

    assert asyncio.run(race()) == key  # it began before the shred: it may answer with the old key, once
    with pytest.raises(Erased):
        asyncio.run(keyring.key("ten_a", 3))


async def _no_leaves(_tenant: str, _count: int) -> int:
    raise AssertionError("these tests seal under leaves they name")


def test_what_is_opened_is_kept_with_its_key_and_goes_with_it(tmp_path: Path) -> None:
    """`Sealer.keep` holds what was opened under a leaf exactly as long as the leaf's cached key: it expires with the
    key, goes with a shred here or one another process announces, and is not kept at all when the key went while it
    was being opened (a shred raced the read)."""
    clock = Clock()
    sealer = Sealer(Keyring(LocalProvider(tmp_path / "keys"), ttl_s=60, clock=clock), Leaves(_no_leaves))
    where = Binding("ten_a", "memory_records", '["ns","k",1]', "value")

    async def opened(leaf: int) -> bytes:
        sealed = await sealer.seal_bytes(leaf, where, b"value")  # derives and caches the leaf's key
        return await sealer.open_bytes(where, sealed)

    assert asyncio.run(opened(3)) == b"value"
    clock.now += 30
    sealer.keep("ten_a", 3, "tag", "value")
    assert sealer.recall("ten_a", 3, "tag") == "value" and sealer.recall("ten_a", 3, "other", 7) == 7
    clock.now += 30  # the key was cached 60 s ago: the kept value expires with it, not 60 s after it was kept
    assert sealer.recall("ten_a", 3, "tag") is None

    asyncio.run(opened(3))
    sealer.keep("ten_a", 3, "tag", "value")
    sealer.forget_cached("ten_a", [3])  # another process shredded it
    assert sealer.recall("ten_a", 3, "tag") is None
    sealer.keep("ten_a", 3, "tag", "value")  # opened before the news: its key is gone, so it is not kept
    assert sealer.recall("ten_a", 3, "tag") is None

    asyncio.run(opened(4))
    for n in range(20):
        sealer.keep("ten_a", 4, n, n)
    assert sealer.recall("ten_a", 4, 0) is None and sealer.recall("ten_a", 4, 19) == 19  # a few per leaf, newest
    asyncio.run(sealer.shred("ten_a", [4]))
    assert sealer.recall("ten_a", 4, 19) is None and len(sealer.opened) == 0
