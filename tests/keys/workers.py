"""What the key tests run in child processes (spawned: each one a fresh interpreter, like another Lethe process).

Every race is forced with a barrier or an event, never with time: a child that must be killed mid-step parks at
that step after saying so, and the test kills it by pid.
"""

from __future__ import annotations

import asyncio
import threading
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path

from app.keys.keyring import Keyring
from app.keys.local import LocalProvider
from app.keys.provider import Cover


class _GatedProvider(LocalProvider):
    """Its first read waits at the barrier, so every racer reads the same version before any of them writes."""

    def __init__(self, directory: Path, barrier: Barrier) -> None:
        super().__init__(directory)
        self._barrier = barrier
        self._gated = False

    def read(self, tenant: str, shard: int) -> Cover | None:
        cover = super().read(tenant, shard)
        if not self._gated:
            self._gated = True
            self._barrier.wait()
        return cover


def derive_after_barrier(directory: str, tenant: str, leaf: int, barrier: Barrier, out: str) -> None:
    """Reads (or creates) the leaf's shard in a race with another process, then writes the key it derived."""
    keyring = Keyring(_GatedProvider(Path(directory), barrier))
    Path(out).write_bytes(asyncio.run(keyring.key(tenant, leaf)))


def shred_after_barrier(directory: str, tenant: str, leaves: list[int], barrier: Barrier) -> None:
    asyncio.run(Keyring(_GatedProvider(Path(directory), barrier)).shred(tenant, leaves))


def shred_until(directory: str, tenant: str, leaves: list[int], step: str, reached: Event) -> None:
    """Shreds, and parks for good right after `step` is durable (the test SIGKILLs it there)."""

    def on_step(name: str) -> None:
        if name == step:
            reached.set()
            threading.Event().wait()

    asyncio.run(Keyring(LocalProvider(Path(directory), on_step=on_step)).shred(tenant, leaves))


def rotate_until(database_url: str, directory: str, step: str, reached: Event) -> None:
    """`lethe keys rotate`'s work over the real database, parked for good right after `step` is durable."""
    from app.db.database import Database
    from app.forget.shredding import Shredder
    from app.keys.admin import KeyAdmin
    from app.keys.content import Sealer
    from app.keys.leaves import Leaves
    from app.tenants.service import TenantService

    def on_step(name: str) -> None:
        if name == step:
            reached.set()
            threading.Event().wait()

    async def run() -> None:
        db = Database(database_url, pool_size=1)
        provider = LocalProvider(Path(directory), on_step=on_step)
        sealer = Sealer(Keyring(provider), Leaves(TenantService(db).reserve_leaves))
        await KeyAdmin(db, provider, Shredder(db, sealer), horizon_s=300).rotate()

    asyncio.run(run())
