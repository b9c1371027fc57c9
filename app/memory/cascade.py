"""The seam between a memory forget and its cascade into sessions (and its shred), and the expiry of records whose
time ran out.

An expired record is forgotten like any other: its tombstone, the erasure of its history and its cascade job commit in
one transaction (`expire_in`), then its leaves are shredded. The first read or search that meets it does that, and so
does the sweep (`Expiry.sweep`), which the app runs in the background so a record nobody reads again is not merely
hidden forever.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Protocol

from app.db.database import Database
from app.db.statements import Sql
from app.keys.content import Sealer
from app.memory.repositories import records as repo
from app.memory.repositories import search
from app.memory.repositories.records import ErasedHistory

log = logging.getLogger(__name__)

EXPIRY_SOURCE = "ttl"  # the tombstone's `source`: who forgot it
SWEEP_BATCH = 500


@dataclass(frozen=True)
class Tombstoned:
    """A forget of one record, committed or about to be: its tombstone version, the job carrying its cascade and
    shred (None: no job), and the leaves its erased values were sealed under."""

    version: int
    forget_id: str | None
    leaves: list[int] = field(default_factory=list)


class ForgetCascade(Protocol):
    """The seam for what follows a memory forget: the forget job that replays every session the record reached, and
    the shred of the leaves the forget erased.

    `enqueue` is called inside the tombstone's transaction, so the job is enqueued if and only if the tombstone
    commits (a transactional outbox); the job records the leaves `erased` names. Returns the job id (`fgt_...`)
    that DELETE answers as `forget_id`. `shred` is called once that transaction committed: it punctures the leaves
    and records the job's erasure at rest complete (True), or leaves it pending (the key provider is down) for the
    forget worker to retry (False).
    """

    async def enqueue(
        self, sql: Sql, *, tenant_id: str, namespace: str, key: str, tombstone_version: int, erased: ErasedHistory
    ) -> str | None: ...

    async def shred(self, tenant_id: str, forget_id: str | None, leaves: list[int]) -> bool: ...


class NoCascade:
    """No forget jobs (tests of memory alone): nothing to enqueue, so DELETE answers `forget_id: null`; a shred
    punctures the leaves at once and, the provider down, is not retried."""

    def __init__(self, sealer: Sealer) -> None:
        self.sealer = sealer

    async def enqueue(
        self, sql: Sql, *, tenant_id: str, namespace: str, key: str, tombstone_version: int, erased: ErasedHistory
    ) -> str | None:
        return None

    async def shred(self, tenant_id: str, forget_id: str | None, leaves: list[int]) -> bool:
        await self.sealer.shred(tenant_id, leaves)
        return True


async def expire_in(sql: Sql, cascade: ForgetCascade, tenant_id: str, namespace: str, key: str) -> Tombstoned | None:
    """Tombstone the key if its time ran out, in the caller's transaction; None when it had not run out (a write or
    a refresh beat us) or it was already a tombstone. The caller shreds (`ForgetCascade.shred`) once it commits."""
    tomb = await repo.expire(sql, tenant_id, namespace, key, source=EXPIRY_SOURCE)
    if tomb is None:
        return None
    erased = await repo.erase_history(sql, tenant_id, namespace, key, tombstone=tomb, source=EXPIRY_SOURCE)
    forget_id = await cascade.enqueue(
        sql, tenant_id=tenant_id, namespace=namespace, key=key, tombstone_version=tomb.version, erased=erased
    )
    return Tombstoned(version=tomb.version, forget_id=forget_id, leaves=erased.leaves)


class Expiry:
    """Forgets expired records: the ones a read met, and (`sweep`) every one whose time ran out."""

    def __init__(self, db: Database, cascade: ForgetCascade) -> None:
        self.db = db
        self.cascade = cascade

    async def expire(self, tenant_id: str, namespace: str, key: str) -> int | None:
        async with self.db.pg_transaction(forget=True) as sql:
            expired = await expire_in(sql, self.cascade, tenant_id, namespace, key)
        if expired is None:
            return None
        await self.cascade.shred(tenant_id, expired.forget_id, expired.leaves)
        log.info("memory key expired", extra={"namespace": namespace, "key": key, "version": expired.version})
        return expired.version

    async def expire_all(self, tenant_id: str, records: list[tuple[str, str]]) -> None:
        for namespace, key in records:  # one transaction each: no lock is held across records
            await self.expire(tenant_id, namespace, key)

    async def sweep(self, *, limit: int = SWEEP_BATCH) -> int:
        """Forget up to `limit` records of any tenant whose time ran out; how many were forgotten."""
        async with self.db.pg() as sql:
            due = await search.due(sql, limit=limit)
        done = 0
        for tenant_id, namespace, key in due:
            done += await self.expire(tenant_id, namespace, key) is not None
        return done

    async def run(self, *, interval_s: float) -> None:
        """The background sweep: forever, every `interval_s` seconds (sooner while a sweep found a full batch)."""
        while True:
            try:
                full = await self.sweep() >= SWEEP_BATCH
            except Exception:  # a database outage must not end the sweep for the process's lifetime
                log.exception("memory expiry sweep failed")
                full = False
            if not full:
                await asyncio.sleep(interval_s)
