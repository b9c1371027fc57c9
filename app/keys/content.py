"""Content at rest: the one object repositories take to seal what they store and open what they read.

A repository that stores content a user or a model wrote (a memory value first; artifacts, forget targets and thread
blobs next, issue 42) is handed the process's `Sealer` by the composition root. It asks for a leaf per erasure unit
(`leaf`), seals under it with a `Binding` naming where the bytes go, opens what it reads (`Erased` when a forget
punctured the leaf: the caller renders the content as erased), and a forget `shred`s the leaves it erased. Services
and endpoints never see a ciphertext; everything here speaks JSON values (a memory value) or the bytes a repository
packs its content into (an artifact's text, token ids and embedding).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Any

from app.keys.cache import KeyCache
from app.keys.envelope import Binding
from app.keys.errors import Erased, Unavailable
from app.keys.keyring import Keyring
from app.keys.leaves import Leaves

log = logging.getLogger(__name__)

# Tells the other processes to stop deriving these leaves (app/db/notifications.py: the job-events channel).
Announce = Callable[[str, list[int]], Awaitable[None]]


async def _nobody(_tenant: str, _leaves: list[int]) -> None:
    return None


# Content a process keeps opened (`Sealer.recall`): up to this many leaves, and a few items under each (an artifact's
# vector; a memory record's recent versions and their embeddings). 50k leaves of MiniLM vectors are about 77 MB.
OPENED = 50_000
_PER_LEAF = 8


class Sealer:
    def __init__(self, keyring: Keyring, leaves: Leaves, *, announce: Announce = _nobody,
                 opened: int = OPENED) -> None:
        self.keyring = keyring
        self.leaves = leaves
        self.announce = announce
        # What was opened here, by leaf: a retrieval turn ranks its session's vectors again and again, a memory search
        # filters and ranks the same records. Plaintext like the keys, so bounded and dropped with them: by every
        # shred (this process's, and other processes' through `forget_cached`), and never kept past the expiry of
        # the cached key it was opened with (`keep`), so within the key caches' time to live at the latest.
        self.opened: KeyCache[dict[Hashable, Any]] = KeyCache(
            capacity=opened, ttl_s=keyring.ciphers.ttl_s, clock=keyring.ciphers.clock)

    def recall(self, tenant: str, leaf: int, tag: Hashable, default: Any = None) -> Any:
        """What this process opened under `leaf` and kept as `tag` (`keep`), or `default`. A tag names exactly what
        was opened (a row version; a ciphertext and where it is stored), so a hit is what opening again would give."""
        found = self.opened.get((tenant, leaf))
        return default if found is None else found.get(tag, default)

    def keep(self, tenant: str, leaf: int, tag: Hashable, value: Any) -> None:
        """Keep `value`, opened under `leaf` just now, as `tag`, until the leaf's cached key expires. Nothing is kept
        when that key is no longer cached: a shred dropped it while the value was being opened, and the value must
        not outlive it. Callers must not mutate what they keep or recall (it is shared)."""
        until = self.keyring.ciphers.expiry((tenant, leaf))
        if until is None:
            return
        name = (tenant, leaf)
        items = dict(self.opened.get(name) or {})
        items.pop(tag, None)
        items[tag] = value  # the newest last: the oldest go first past _PER_LEAF
        while len(items) > _PER_LEAF:
            del items[next(iter(items))]
        self.opened.put(name, items, until=until)

    async def leaf(self, tenant: str, stream: Hashable) -> int:
        """A fresh leaf for a new erasure unit; units of one stream (a memory namespace, a session) get neighbours.

        A database restored from a backup hands out again the leaves given out after the backup was taken (its
        counter went back with it). One that a forget punctured since is skipped: sealing under it would fail as
        erased. A live one is taken: no row of this database uses it any more (docs/erasure-at-rest.md)."""
        while True:
            leaf = await self.leaves.next(tenant, stream)
            try:
                await self.keyring.cipher(tenant, leaf)  # derived and cached: the seal that follows needs it anyway
            except Erased:
                log.info("leaf skipped: punctured (a database restored from a backup)", extra={"leaf": leaf})
                continue
            except Unavailable:
                # The key provider is down: a seal under this leaf answers 503 itself, and a leaf drawn only to
                # mark a unit (a forget job that stores no content) needs no key. A forget never waits for keys.
                pass
            return leaf

    async def seal_json(self, leaf: int, binding: Binding, value: Any) -> bytes:
        """`value` as JSON, sealed under `leaf` for the place `binding` names; `Unavailable` when the leaf's cover is
        not cached and the provider is down (nothing is written then), `Erased` when the leaf is punctured."""
        plaintext = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
        return await self.seal_bytes(leaf, binding, plaintext)

    async def open_json(self, binding: Binding, ciphertext: bytes) -> Any:
        """The value sealed there; `Erased` when its leaf was shredded, `Tampered` when the bytes were moved."""
        return json.loads(await self.open_bytes(binding, ciphertext))

    async def seal_bytes(self, leaf: int, binding: Binding, plaintext: bytes) -> bytes:
        """`plaintext` sealed under `leaf` for the place `binding` names (errors as `seal_json`'s)."""
        return await self.keyring.seal(leaf, binding, plaintext)

    async def open_bytes(self, binding: Binding, ciphertext: bytes) -> bytes:
        """The bytes sealed there (errors as `open_json`'s)."""
        return await self.keyring.unseal(binding, bytes(ciphertext))

    async def punctured(self, tenant: str, leaves: Iterable[int]) -> set[int]:
        """Which of `leaves` no longer derive a key (to leave their units out without opening them)."""
        found: set[int] = set()
        for leaf in set(leaves):
            try:
                await self.keyring.cipher(tenant, leaf)
            except Erased:
                found.add(leaf)
        return found

    async def reachable(self, tenant: str) -> None:
        """`Unavailable` (503, Retry-After) unless the key provider answers now."""
        await self.keyring.reachable(tenant)

    async def shred(self, tenant: str, leaves: Iterable[int]) -> None:
        """Puncture `leaves` in the provider (idempotent), then tell the other processes. `Unavailable`: the provider
        is down and the shred must be retried; this process stopped deriving them already."""
        wanted = sorted(set(leaves))
        if not wanted:
            return
        self.opened.drop((tenant, leaf) for leaf in wanted)
        await self.keyring.shred(tenant, wanted)
        try:
            await self.announce(tenant, wanted)
        except Exception as exc:  # the others' caches then drop them within their time to live (half the horizon)
            log.warning("shred announcement failed", extra={"error": type(exc).__name__, "leaves": len(wanted)})

    def forget_cached(self, tenant: str, leaves: Iterable[int]) -> None:
        """Another process shredded `leaves`: stop deriving them here, and drop what was opened under them."""
        leaves = list(leaves)
        self.opened.drop((tenant, leaf) for leaf in leaves)
        self.keyring.forget_cached(tenant, leaves)
