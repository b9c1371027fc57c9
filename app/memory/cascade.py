"""The seam between a memory forget and its cascade into sessions, and the expiry of records whose time ran out.

An expired record is forgotten like any other: its tombstone, the erasure of its history and its cascade job commit in
one transaction (`expire_in`). The first read or search that meets it does that, and so does the sweep
(`Expiry.sweep`), which the app runs in the background so a record nobody reads again is not merely hidden forever.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from app.db.database import Database
from app.db.statements import Sql
from app.memory.repositories import records as repo
from app.memory.repositories import search

log = logging.getLogger(__name__)

EXPIRY_SOURCE = "ttl"  # the tombstone's `source`: who forgot it
SWEEP_BATCH = 500


class ForgetCascade(Protocol):
    """The seam for the cascade into sessions (the forget job that replays every session the record reached).

    Called inside the tombstone's transaction, so the job is enqueued if and only if the tombstone commits
    (a transactional outbox). Returns the job id (`fgt_...`) that DELETE answers as `forget_id`.
    """

    async def enqueue(
        self, sql: Sql, *, tenant_id: str, namespace: str, key: str, tombstone_version: int
    ) -> str | None: ...


class NoCascade:
    """Until forget jobs exist: nothing to enqueue, so DELETE answers `forget_id: null`."""

    async def enqueue(
        self, sql: Sql, *, tenant_id: str, namespace: str, key: str, tombstone_version: int
    ) -> str | None:
        return None


async def expire_in(sql: Sql, cascade: ForgetCascade, tenant_id: str, namespace: str, key: str) -> int | None:
    """Tombstone the key if its time ran out, in the caller's transaction; the tombstone version, or None when it
    had not run out (a write or a refresh beat us) or it was already a tombstone."""
    tomb = await repo.expire(sql, tenant_id, namespace, key, source=EXPIRY_SOURCE)
    if tomb is None:
        return None
    await repo.erase_history(sql, tenant_id, namespace, key, tombstone=tomb, source=EXPIRY_SOURCE)
    await cascade.enqueue(sql, tenant_id=tenant_id, namespace=namespace, key=key, tombstone_version=tomb.version)
    return tomb.version


class Expiry:
    """Forgets expired records: the ones a read met, and (`sweep`) every one whose time ran out."""

    def __init__(self, db: Database, cascade: ForgetCascade) -> None:
        self.db = db
        self.cascade = cascade

    async def expire(self, tenant_id: str, namespace: str, key: str) -> int | None:
        async with self.db.pg_transaction(forget=True) as sql:
            version = await expire_in(sql, self.cascade, tenant_id, namespace, key)
        if version is not None:
            log.info("memory key expired", extra={"namespace": namespace, "key": key, "version": version})
        return version

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
