"""Keys are never lost by accident: the database knows which key store sealed its content, and refuses another.

A wiped, missing or swapped key store reads as "never written": a process would create fresh covers for every shard,
every ciphertext sealed before would fail as `Tampered`, and new content would be sealed under keys that do not
match the old ones. So the first process that starts on a database records the key store's identity
(`KeyProvider.identity()`, made by the store on first use), and every process after it, `lethe serve` and the
`lethe keys` commands alike, checks its own store against it before it reads or writes anything sealed.
"""

from __future__ import annotations

import asyncio

from app.db.database import Database
from app.keys import repository as repo
from app.keys.factory import provider_location
from app.keys.provider import KeyProvider
from app.settings import Settings


class KeyStoreMismatch(RuntimeError):
    """The key store the settings point at is not the one this database's content was sealed with."""


async def check_key_store(db: Database, provider: KeyProvider, settings: Settings) -> None:
    """Records the key store's identity if the database has none yet; `KeyStoreMismatch` if it has another.
    `Unavailable` when the store cannot be reached: nothing is known then, and nothing may start."""
    found = await asyncio.to_thread(provider.identity)
    async with db.pg() as sql:
        recorded = await repo.record_identity(sql, found, provider.name)
    if recorded.identity != found:
        raise KeyStoreMismatch(
            f"this database's content was sealed with key store {recorded.identity} ({recorded.provider}); "
            f"{provider_location(settings)} points at key store {found}: starting would read every sealed value as "
            "tampered and seal new content under keys that do not match. Point the settings at the key store this "
            "database was sealed with (restore it from where you keep it), or use a fresh database for this one."
        )
