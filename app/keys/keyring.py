"""Data keys by leaf: derived from the shard's cover, cached, punctured by a forget.

A leaf is a tenant's data key number (one erasure unit: an artifact, a memory record's value, a forget job's
target); its shard is `leaf >> tree.BITS`. Leaves are handed out by the repositories (a per-tenant counter, in
blocks), never reused. Deriving a leaf's key needs the shard's cover: from the cache, else from the provider (a
shard never written is created then, durably, before any key of it is used). A forget punctures its leaves' covers
(`shred`): from then on no cover derives them, and since PostgreSQL never held key material, no copy of it can.

The provider is called only on a cover cache miss, to create a shard and to shred: reads and writes under cached
covers keep working while it is down, anything that needs it raises `Unavailable` before anything is written.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from app.keys import envelope, tree
from app.keys.cache import KeyCache
from app.keys.envelope import Binding
from app.keys.errors import Erased, Missing
from app.keys.provider import Cover, KeyProvider

T = TypeVar("T")
_ATTEMPTS = 16  # compare-and-set races lost in a row before giving up (each one is another writer's success)


def shard_of(leaf: int) -> int:
    return leaf >> tree.BITS


class _ShardShreds:
    """The shreds of one shard waiting in this process: leaves queued, tickets in order, and the last ticket whose
    leaves a write carried."""

    def __init__(self) -> None:
        self.writing = asyncio.Lock()
        self.waiting: set[int] = set()
        self.tickets = 0
        self.written = 0

    def queue(self, indices: Iterable[int]) -> int:
        self.waiting.update(indices)
        self.tickets += 1
        return self.tickets

    def take(self) -> tuple[set[int], int]:
        batch, self.waiting = self.waiting, set()
        return batch, self.tickets

    def put_back(self, batch: set[int]) -> None:
        self.waiting |= batch


@dataclass(frozen=True, slots=True)
class Census:
    """What `lethe keys verify` reports for a set of leaves: derivable (`live`) or punctured (`erased`)."""

    live: int
    erased: list[int]


class Keyring:
    def __init__(
        self, provider: KeyProvider, *, ttl_s: float = 150.0, capacity: int = 100_000,
        clock: Callable[[], float] = time.monotonic, creates: bool = True,
    ) -> None:
        """`creates=False`: a shard never written raises `Missing` instead of being created (to check a key store
        against the content that names it, without writing to it)."""
        self.provider = provider
        self.creates = creates
        # Both bounded in time: a shred another process's notification did not reach stops deriving within ttl_s.
        self.covers: KeyCache[Cover] = KeyCache(capacity=max(1, capacity // 64), ttl_s=ttl_s, clock=clock)
        self.ciphers: KeyCache[AESGCM] = KeyCache(capacity=capacity, ttl_s=ttl_s, clock=clock)
        # Bumped by every drop: what was fetched while a drop happened is returned but not cached, so a read that
        # raced a shred cannot put the cover from before the shred back into the cache.
        self._drops = 0
        self._shreds: dict[tuple[str, int], _ShardShreds] = {}

    async def _cached(self, cache: KeyCache[T], name: Hashable, fetch: Callable[[], Awaitable[T]]) -> T:
        """`name` from `cache`, else fetched and cached, unless a drop happened meanwhile (the fetch may predate it)."""
        cached = cache.get(name)
        if cached is not None:
            return cached
        drops = self._drops
        value = await fetch()
        if drops == self._drops:
            cache.put(name, value)
        return value

    async def _cover(self, tenant: str, shard: int) -> Cover:
        async def fetch() -> Cover:
            for _ in range(_ATTEMPTS):
                cover = await asyncio.to_thread(self.provider.read, tenant, shard)
                if cover is None and not self.creates:
                    raise Missing(f"shard {shard} of tenant {tenant!r} is not in the key store")
                if cover is None:
                    cover = await asyncio.to_thread(self.provider.write, tenant, shard, tree.fresh(), 0)
                if cover is not None:
                    return cover
            raise RuntimeError(f"shard {shard} of tenant {tenant!r} kept changing while it was created")

        return await self._cached(self.covers, (tenant, shard), fetch)

    async def reachable(self, tenant: str) -> None:
        """`Unavailable` unless the provider answers now (a read of the tenant's first shard, never cached): asked
        before a forget that must shred at once writes anything."""
        await asyncio.to_thread(self.provider.read, tenant, 0)

    async def key(self, tenant: str, leaf: int) -> bytes:
        """The data key of `leaf`; `Erased` once a forget punctured it."""
        cover = await self._cover(tenant, shard_of(leaf))
        return tree.derive(cover.nodes, leaf % tree.LEAVES)

    async def cipher(self, tenant: str, leaf: int) -> AESGCM:
        """The AEAD of `leaf`'s data key, cached; `Erased` once a forget punctured it."""

        async def fetch() -> AESGCM:
            return envelope.cipher(await self.key(tenant, leaf))

        return await self._cached(self.ciphers, (tenant, leaf), fetch)

    async def shred(self, tenant: str, leaves: Iterable[int]) -> None:
        """Punctures `leaves` in the provider: once this returns no cover derives them (idempotent)."""
        by_shard: dict[int, list[int]] = defaultdict(list)
        for leaf in leaves:
            by_shard[shard_of(leaf)].append(leaf)
        for shard, members in sorted(by_shard.items()):
            # First: this process stops deriving them even if the provider is down and the shred retried.
            self.forget_cached(tenant, members)
            await self._coalesced(tenant, shard, [leaf % tree.LEAVES for leaf in members])

    async def _coalesced(self, tenant: str, shard: int, indices: list[int]) -> None:
        """Punctures `indices` in one write with every other shred of the shard this process has waiting. Shreds of
        one shard write one at a time: racing each other, each would read the same cover and all but one would lose
        the compare-and-set and read again (32 clients forgetting at once lost 16 times in a row). A shred that finds
        its leaves written by the batch before it returns at once."""
        shreds = self._shreds.setdefault((tenant, shard), _ShardShreds())
        ticket = shreds.queue(indices)
        async with shreds.writing:
            if shreds.written >= ticket:
                return
            batch, upto = shreds.take()
            try:
                await self._puncture(tenant, shard, sorted(batch))
            except BaseException:
                shreds.put_back(batch)  # the next shred in line writes them, or its caller retries
                raise
            shreds.written = upto

    async def _puncture(self, tenant: str, shard: int, indices: list[int]) -> None:
        for _ in range(_ATTEMPTS):
            cover = await asyncio.to_thread(self.provider.read, tenant, shard)
            # A shard never written gets a cover without these leaves, so no later process derives them.
            nodes = tree.puncture(cover.nodes if cover else tree.fresh(), indices)
            if cover is not None and nodes == cover.nodes:
                await asyncio.to_thread(self.provider.sweep, tenant, shard)  # a killed write's leftovers
                return
            if await asyncio.to_thread(self.provider.write, tenant, shard, nodes, cover.version if cover else 0):
                return
        raise RuntimeError(f"shard {shard} of tenant {tenant!r} kept changing under the shred; run it again")

    def forget_cached(self, tenant: str, leaves: Iterable[int]) -> None:
        """Stops deriving `leaves` here (a shred of this process or another's notification). Cached covers are
        punctured in place rather than dropped, so the shard's other leaves stay readable while the provider is
        down."""
        by_shard: dict[int, list[int]] = defaultdict(list)
        for leaf in leaves:
            by_shard[shard_of(leaf)].append(leaf)
        self._drops += 1
        for shard, members in by_shard.items():
            cached = self.covers.get((tenant, shard))
            if cached is not None:
                punctured = tree.puncture(cached.nodes, [leaf % tree.LEAVES for leaf in members])
                self.covers.replace((tenant, shard), Cover(cached.version, punctured))
            self.ciphers.drop((tenant, leaf) for leaf in members)

    async def seal(self, leaf: int, binding: Binding, plaintext: bytes) -> bytes:
        return envelope.seal(await self.cipher(binding.tenant, leaf), leaf, binding, plaintext)

    async def unseal(self, binding: Binding, ciphertext: bytes) -> bytes:
        """The plaintext; `Erased` when its leaf is punctured (render as erased), `Tampered` when it was moved."""
        aead = await self.cipher(binding.tenant, envelope.leaf(ciphertext))
        return envelope.unseal(aead, binding, ciphertext)

    async def census(self, tenant: str, leaves: Iterable[int]) -> Census:
        live, erased = 0, []
        for leaf in leaves:
            try:
                await self.key(tenant, leaf)
                live += 1
            except Erased:
                erased.append(leaf)
        return Census(live, erased)
