"""Versioned memory records with durable tombstones: the rules of docs/API.md "Memory".

Every key has a version that only grows. A write names the version it is based on (0: the key was never written)
and lands only if the key is still at that version; a forget is a tombstone *version*, so a write based on anything
older than the tombstone can never land, however late it arrives. Re-establishing a forgotten key needs the tombstone
version: the writer proves it saw the forget.

Forgetting a never-written key writes tombstone version 1 rather than doing nothing: the user asked for the fact to
be gone, and a stale "create if absent" (base 0) issued before the forget must not land after it.

All SQL lives in `app.memory.repositories`; this module decides what a result means and raises typed errors.
Values are sealed at rest there too (app/memory/repositories/sealing.py): this module hands the process's `Sealer`
to the repositories and sees only JSON values. A value whose leaf a forget shredded (a backup restored from before
the forget) reads as forgotten; a forget shreds the leaves it erased once its tombstone committed, before it answers.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from app.db.consistency import PRIMARY, ReadFrom
from app.db.database import Database
from app.db.statements import InSession, Sql
from app.errors import InvalidRequest, NotFound, PreconditionFailed
from app.holds.guard import refuse_namespace
from app.keys.content import Sealer
from app.keys.errors import ShredPending
from app.memory.cascade import Expiry, ForgetCascade, NoCascade
from app.memory.in_transaction import ForgetOutcome, forget_in
from app.memory.repositories import records as repo
from app.memory.repositories import search as search_repo
from app.memory.repositories import values as values_repo
from app.memory.repositories.records import Head, State, VersionRow, Written
from app.memory.repositories.values import LiveRecord
from app.memory.validation import (
    check_key,
    check_namespace,
    check_source,
    check_value,
    decode_cursor,
    encode_cursor,
    etag,
)

log = logging.getLogger(__name__)

MAX_TTL_S = 10 * 365 * 24 * 3600.0  # ten years: longer is "never", which is no TTL at all
MAX_VALUES_PAGE = 100  # records a page with their values (each value may be as large as a request body)


class Forgotten(NotFound):
    """A 404 that says the key existed and was forgotten, with the tombstone version as `version` and ETag."""

    type_slug = "memory-forgotten"
    title = "Forgotten"


@dataclass(frozen=True)
class WriteRequest:
    key: str
    value: Any
    base_version: int  # 0: create a never-written key
    source: str
    ttl_s: float | None = None  # the version expires this many seconds after it is written (None: never)


@dataclass(frozen=True)
class WriteOutcome:
    key: str
    version: int
    created: bool
    updated_at: datetime


@dataclass(frozen=True)
class Rejected:
    """A write of a non-atomic batch that did not land."""

    key: str
    current_version: int
    forgotten: bool


@dataclass(frozen=True)
class HistoryItem:
    version: int
    op: Literal["write", "forget"]
    source: str
    at: datetime
    value: Any
    erased: bool  # a write whose value a later forget removed


def _lands(state: State | None, base: int) -> bool:
    """Whether a write based on `base` would land on a key in `state` (None: never written)."""
    version = 0 if state is None else state.version
    return version == base


class MemoryService:
    def __init__(self, db: Database, sealer: Sealer, *, cascade: ForgetCascade | None = None) -> None:
        self.db = db
        self.sealer = sealer
        self.cascade: ForgetCascade = cascade or NoCascade(sealer)
        self.expiry = Expiry(db, self.cascade)

    async def read(
        self, tenant_id: str, namespace: str, key: str, *, where: ReadFrom = PRIMARY, refresh_ttl: bool = False
    ) -> Head:
        """`where`: the primary by default; the HTTP route lets a replica serve it as the request's token allows.
        An expired record is forgotten here and answers as forgotten; `refresh_ttl` restarts a live one's time."""
        check_namespace(namespace)
        check_key(key)
        head = await self.db.read_pg(where, lambda sql: repo.get_head(sql, self.sealer, tenant_id, namespace, key))
        if head is not None and head.expired and not head.forgotten:
            await self.expiry.expire(tenant_id, namespace, key)
            head = await self.db.read_pg(
                PRIMARY, lambda sql: repo.get_head(sql, self.sealer, tenant_id, namespace, key)
            )
        if head is not None and refresh_ttl and head.expires_at is not None and not (head.forgotten or head.erased):
            async with self.db.pg() as sql:
                refreshed = await search_repo.refresh(sql, tenant_id, [(namespace, key)])
            head = replace(head, expires_at=refreshed.get((namespace, key), head.expires_at))
        if head is None:
            raise NotFound("this key was never written", version=0, forgotten=False, headers={"ETag": etag(0)})
        if head.forgotten or head.erased:  # erased: a live row whose leaf a forget shredded (a restored backup)
            version = head.version
            raise Forgotten("this key was forgotten", version=version, forgotten=True, headers={"ETag": etag(version)})
        return head

    async def write(
        self, tenant_id: str, namespace: str, key: str, *, value: Any, source: str, base_version: int,
        ttl_s: float | None = None,
    ) -> WriteOutcome:
        check_namespace(namespace)
        w = WriteRequest(key=key, value=value, base_version=base_version, source=source, ttl_s=ttl_s)
        self._check_write(w)
        async with self.db.pg() as sql:  # one statement: it commits on its own
            written = await self._attempt(sql, tenant_id, namespace, w)
            if written is None:
                state = await self._state(sql, tenant_id, namespace, key)
                raise PreconditionFailed(
                    f"the key is at version {state.version}, not {base_version}"
                    + (
                        ": it was forgotten; re-establish it with If-Match of the tombstone version"
                        if state.forgotten
                        else ""
                    ),
                    current_version=state.version,
                    forgotten=state.forgotten,
                    headers={"ETag": etag(state.version)},
                )
        return WriteOutcome(key=key, version=written.version, created=base_version == 0, updated_at=written.updated_at)

    async def forget(
        self, tenant_id: str, namespace: str, key: str, *, source: str = "user", shred_now: bool = False
    ) -> ForgetOutcome:
        """Tombstone the key; returns only after the tombstone (and the erasure of every earlier value) committed.
        With `shred_now`, also only once their keys are destroyed: a provider that does not answer refuses it before
        anything is written (`Unavailable`), and one that refuses the shred after the commit answers `ShredPending`
        (the key is forgotten; its job completes the shred)."""
        check_namespace(namespace)
        check_key(key)
        check_source(source)
        if shred_now:
            await self.sealer.reachable(tenant_id)
        async with self.db.pg_transaction(forget=True) as sql:  # the tombstone and its cascade job commit together
            await refuse_namespace(sql, tenant_id, namespace)  # 409 legal_hold while a hold covers it
            outcome, erased = await forget_in(sql, self.cascade, tenant_id, namespace, key, source=source)
        # After the commit, never before: a shred whose tombstone rolled back would erase a live value.
        shredded = await self.cascade.shred(tenant_id, outcome.forget_id, outcome.leaves)
        if shred_now and not shredded:
            assert outcome.forget_id is not None  # leaves to shred: the tombstone recorded them on its job
            raise ShredPending(outcome.forget_id)
        log.info(
            "memory key forgotten",
            extra={
                "namespace": namespace, "key": key,
                "version": outcome.version,
                "already_forgotten": outcome.already_forgotten,
                "erased_versions": erased,
            },
        )
        return outcome

    async def batch(
        self, tenant_id: str, namespace: str, writes: Sequence[WriteRequest], *, atomic: bool
    ) -> list[WriteOutcome | Rejected]:
        check_namespace(namespace)
        for write in writes:
            self._check_write(write)
        if atomic:
            return list(await self._atomic_batch(tenant_id, namespace, writes))
        results: list[WriteOutcome | Rejected] = []
        async with self.db.pg() as sql:
            for w in writes:  # each write commits on its own: independent, and no lock outlives its statement
                written = await self._attempt(sql, tenant_id, namespace, w)
                if written is None:
                    state = await self._state(sql, tenant_id, namespace, w.key)
                    results.append(Rejected(key=w.key, current_version=state.version, forgotten=state.forgotten))
                else:
                    results.append(
                        WriteOutcome(
                            key=w.key, version=written.version, created=w.base_version == 0,
                            updated_at=written.updated_at,
                        )
                    )
        return results

    async def list_keys(
        self, tenant_id: str, namespace: str, *, cursor: str | None, limit: int, where: ReadFrom = PRIMARY
    ) -> tuple[list[str], str | None]:
        check_namespace(namespace)
        after = None if cursor is None else decode_cursor(cursor)
        rows = await self.db.read_pg(
            where, lambda sql: repo.live_keys(sql, self.sealer, tenant_id, namespace, after=after, limit=limit + 1)
        )
        more = len(rows) > limit  # one extra row tells whether another page exists without a COUNT
        rows = rows[:limit]
        # A key whose leaf was shredded reads as forgotten, so it is not listed; the cursor still moves past it.
        keys = [row.key for row in rows if not row.erased]
        return keys, encode_cursor(rows[-1].key) if more else None

    async def list_records(
        self, tenant_id: str, namespace: str, *, cursor: str | None, limit: int, where: ReadFrom = PRIMARY
    ) -> tuple[list[LiveRecord], str | None]:
        """`list_keys` with each record's value, opened: one statement per page (`?values=true`), at most
        `MAX_VALUES_PAGE` records whatever `limit` asks."""
        check_namespace(namespace)
        limit = min(limit, MAX_VALUES_PAGE)
        after = None if cursor is None else decode_cursor(cursor)
        rows = await self.db.read_pg(
            where,
            lambda sql: values_repo.live_records(sql, self.sealer, tenant_id, namespace, after=after, limit=limit + 1),
        )
        more = len(rows) > limit
        rows = rows[:limit]
        return [row for row in rows if not row.erased], encode_cursor(rows[-1].key) if more else None

    async def records_of(
        self, tenant_id: str, namespace: str, keys: list[str], *, where: ReadFrom = PRIMARY
    ) -> list[LiveRecord]:
        """The live records among `keys` (a page of the key catalog), values opened; erased ones left out."""
        check_namespace(namespace)
        rows = await self.db.read_pg(
            where, lambda sql: values_repo.records_of(sql, self.sealer, tenant_id, namespace, keys)
        )
        return [row for row in rows if not row.erased]

    async def history(
        self, tenant_id: str, namespace: str, key: str, *, where: ReadFrom = PRIMARY
    ) -> list[HistoryItem]:
        check_namespace(namespace)
        check_key(key)
        rows = await self.db.read_pg(where, lambda sql: repo.history(sql, self.sealer, tenant_id, namespace, key))
        if not rows:
            raise NotFound("this key was never written", version=0, forgotten=False)
        last_tombstone = max((r.version for r in rows if r.op == "forget"), default=0)
        return [self._history_item(r, last_tombstone) for r in rows]

    # ---- internals --------------------------------------------------------------------------------------------

    @staticmethod
    def _history_item(row: VersionRow, last_tombstone: int) -> HistoryItem:
        # The forget already nulled these values in the database; masking again keeps the rule in one visible place.
        op: Literal["write", "forget"] = "forget" if row.op == "forget" else "write"
        # row.erased: its leaf was shredded, though no tombstone says so here (a backup restored from before it).
        visible = op == "write" and row.version > last_tombstone and not row.erased
        return HistoryItem(
            version=row.version,
            op=op,
            source=row.source,
            at=row.at,
            value=row.value if visible else None,
            erased=op == "write" and not visible,
        )

    @staticmethod
    def _check_write(write: WriteRequest) -> None:
        check_key(write.key)
        check_source(write.source)
        check_value(write.value)
        if write.base_version < 0:
            raise InvalidRequest("base_version must be 0 (create) or a version you read")
        if write.ttl_s is not None and not 0 <= write.ttl_s <= MAX_TTL_S:
            raise InvalidRequest(f"ttl_s must be between 0 and {MAX_TTL_S:.0f} seconds")

    async def _attempt(self, sql: Sql, tenant_id: str, namespace: str, w: WriteRequest) -> Written | None:
        args = {"value": w.value, "source": w.source, "ttl_s": w.ttl_s}
        if w.base_version == 0:
            return await repo.create_if_absent(sql, self.sealer, tenant_id, namespace, w.key, **args)
        return await repo.write_if_version(sql, self.sealer, tenant_id, namespace, w.key, base=w.base_version, **args)

    async def _state(self, sql: Sql, tenant_id: str, namespace: str, key: str) -> State:
        """Where a key stands after a rejected write; run as a statement of its own, so its fresh snapshot sees the
        write that beat ours. A key whose time ran out is forgotten first: the writer learns of its tombstone."""
        found = await repo.states(sql, tenant_id, namespace, [key])
        if key in found and found[key].expired:
            await self.expiry.expire(tenant_id, namespace, key)
            found = await repo.states(sql, tenant_id, namespace, [key])
        return found.get(key, State(version=0, forgotten=False))

    async def _atomic_batch(
        self, tenant_id: str, namespace: str, writes: Sequence[WriteRequest]
    ) -> list[WriteOutcome | Rejected]:
        # Apply in key order (stable, so one key's writes keep their request order): every atomic batch then locks
        # rows in the same global order, and two batches over the same keys cannot deadlock.
        order = sorted(range(len(writes)), key=lambda i: writes[i].key)
        results: dict[int, WriteOutcome] = {}
        failed: int | None = None
        try:
            async with self.db.transaction() as session:
                for i in order:
                    w = writes[i]
                    written = await self._attempt(InSession(session), tenant_id, namespace, w)
                    if written is None:
                        failed = i
                        raise _AbortBatch  # rolls the whole transaction back
                    results[i] = WriteOutcome(
                        key=w.key, version=written.version, created=w.base_version == 0, updated_at=written.updated_at
                    )
        except _AbortBatch:
            assert failed is not None
            conflicts = await self._batch_conflicts(tenant_id, namespace, writes, failed)
            raise PreconditionFailed(
                "the batch was rejected whole, nothing was written: "
                f"{len(conflicts)} write(s) are based on a version the key no longer has",
                conflicting_keys=sorted({c["key"] for c in conflicts}),
                conflicts=conflicts,
            ) from None
        return [results[i] for i in range(len(writes))]

    async def _batch_conflicts(
        self, tenant_id: str, namespace: str, writes: Sequence[WriteRequest], failed: int
    ) -> list[dict[str, Any]]:
        """Every write of a rejected atomic batch that would not land, replaying the batch against current state.

        The batch aborted at its first conflict; reporting only that one would make a client retry once per stale
        key. Replaying in request order lets a batch that writes one key twice (base v, then v+1) not flag itself.
        """
        async with self.db.pg() as sql:
            current = await repo.states(sql, tenant_id, namespace, sorted({w.key for w in writes}))
            expired = [k for k, state in current.items() if state.expired]
            if expired:
                await self.expiry.expire_all(tenant_id, [(namespace, k) for k in expired])
                current = await repo.states(sql, tenant_id, namespace, sorted({w.key for w in writes}))
        simulated: dict[str, State | None] = {w.key: current.get(w.key) for w in writes}
        conflicts: list[dict[str, Any]] = []
        for i, w in enumerate(writes):
            state = simulated[w.key]
            if _lands(state, w.base_version) and i != failed:
                simulated[w.key] = State(version=w.base_version + 1, forgotten=False)
                continue
            conflicts.append(
                {
                    "index": i,
                    "key": w.key,
                    "base_version": w.base_version,
                    "current_version": 0 if state is None else state.version,
                    "forgotten": False if state is None else state.forgotten,
                }
            )
        return conflicts


class _AbortBatch(Exception):
    """Internal: a write of an atomic batch did not land."""
