"""SQL for memory records. Every statement is scoped to one tenant.

Correctness rests on two rules, both valid at READ COMMITTED:

- A write is ONE conditional statement on the head row (`UPDATE ... WHERE version = :base` or
  `INSERT ... ON CONFLICT DO NOTHING`). When a concurrent transaction changed the head first, PostgreSQL re-checks the
  WHERE clause against the newest committed row, so a write based on a superseded version (a tombstone included)
  matches nothing. The history row is inserted by the same statement (a data-modifying CTE fed by RETURNING), so
  head and history can never disagree.
- A forget locks the head row by turning it into a tombstone, and only then, in a *later* statement of the same
  transaction, erases earlier values from history. A later statement takes a fresh snapshot, which sees every write
  that committed before the tombstone got the lock; nobody can add a version afterwards while we hold the lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession


@dataclass(frozen=True)
class Head:
    """The newest version of a key; `value` is None for a tombstone."""

    version: int
    forgotten: bool
    value: Any
    source: str
    updated_at: datetime


@dataclass(frozen=True)
class Written:
    version: int
    updated_at: datetime


@dataclass(frozen=True)
class State:
    """Where a key stands: version 0 means never written."""

    version: int
    forgotten: bool


@dataclass(frozen=True)
class VersionRow:
    version: int
    op: str
    source: str
    at: datetime
    value: Any


_PK = "tenant_id = :tenant_id AND namespace = :namespace AND key = :key"
# Timestamps use clock_timestamp(), not now(): now() is the transaction's start, so a write that waited on the row
# lock would be stamped earlier than the version it superseded.

# The history row is built from RETURNING, so it carries exactly the version the head got.
_HISTORY_FROM_HEAD = """
    hist AS (
        INSERT INTO memory_versions (tenant_id, namespace, key, version, op, value, source, at)
        SELECT tenant_id, namespace, key, version, 'write', value, source, updated_at FROM head
    )
    SELECT version, updated_at FROM head
"""

_CAS_UPDATE = text(
    f"""
    WITH head AS (
        UPDATE memory_records
           SET version = version + 1, value = :value, forgotten = false, source = :source,
               provenance = :provenance, updated_at = clock_timestamp()
         WHERE {_PK} AND version = :base
        RETURNING tenant_id, namespace, key, version, value, source, updated_at
    ),
    {_HISTORY_FROM_HEAD}
    """
).bindparams(bindparam("value", type_=JSONB), bindparam("provenance", type_=JSONB))

_CREATE = text(
    f"""
    WITH head AS (
        INSERT INTO memory_records
               (tenant_id, namespace, key, version, value, forgotten, source, provenance, updated_at)
        VALUES (:tenant_id, :namespace, :key, 1, :value, false, :source, :provenance, clock_timestamp())
        ON CONFLICT (tenant_id, namespace, key) DO NOTHING
        RETURNING tenant_id, namespace, key, version, value, source, updated_at
    ),
    {_HISTORY_FROM_HEAD}
    """
).bindparams(bindparam("value", type_=JSONB), bindparam("provenance", type_=JSONB))

# A never-written key gets tombstone version 1, so a stale "create if absent" cannot land after the forget.
# On an existing key the upsert locks the row even when the WHERE (already a tombstone) leaves it unchanged.
_TOMBSTONE = text(
    """
    INSERT INTO memory_records (tenant_id, namespace, key, version, value, forgotten, source, updated_at)
    VALUES (:tenant_id, :namespace, :key, 1, NULL, true, :source, clock_timestamp())
    ON CONFLICT (tenant_id, namespace, key) DO UPDATE
       SET version = memory_records.version + 1, value = NULL, forgotten = true, source = EXCLUDED.source,
           provenance = NULL, updated_at = clock_timestamp()
     WHERE NOT memory_records.forgotten
    RETURNING version, updated_at
    """
)

_ERASE_HISTORY = text(
    f"""
    WITH tomb AS (
        INSERT INTO memory_versions (tenant_id, namespace, key, version, op, value, source, at)
        VALUES (:tenant_id, :namespace, :key, :version, 'forget', NULL, :source, :at)
    )
    UPDATE memory_versions SET value = NULL
     WHERE {_PK} AND version < :version AND value IS NOT NULL
    """
)

_HEAD = text(f"SELECT version, forgotten, value, source, updated_at FROM memory_records WHERE {_PK}").columns(
    value=JSONB
)

_LOCKED_STATE = text(f"SELECT version, forgotten FROM memory_records WHERE {_PK} FOR SHARE")

_STATES = text(
    """
    SELECT key, version, forgotten FROM memory_records
     WHERE tenant_id = :tenant_id AND namespace = :namespace AND key = ANY(:keys)
    """
)

# Two statements rather than `(:after IS NULL OR key > :after)`, which would keep the planner off the PK range scan.
_LIVE_KEYS_SQL = """
    SELECT key FROM memory_records
     WHERE tenant_id = :tenant_id AND namespace = :namespace AND NOT forgotten {after}
     ORDER BY key
     LIMIT :limit
"""
_LIVE_KEYS_FIRST = text(_LIVE_KEYS_SQL.format(after=""))
_LIVE_KEYS_AFTER = text(_LIVE_KEYS_SQL.format(after="AND key > :after"))

# FOR SHARE: a session injecting these records and a forget tombstoning one of them serialize (see `injectable`).
_INJECTABLE = text(
    """
    SELECT key, version, value FROM memory_records
     WHERE tenant_id = :tenant_id AND namespace = :namespace AND NOT forgotten
     ORDER BY key
     LIMIT :limit
       FOR SHARE
    """
).columns(value=JSONB)

_HISTORY = text(f"SELECT version, op, source, at, value FROM memory_versions WHERE {_PK} ORDER BY version").columns(
    value=JSONB
)


def _pk(tenant_id: str, namespace: str, key: str) -> dict[str, str]:
    return {"tenant_id": tenant_id, "namespace": namespace, "key": key}


async def get_head(db: AsyncSession, tenant_id: str, namespace: str, key: str) -> Head | None:
    row = (await db.execute(_HEAD, _pk(tenant_id, namespace, key))).one_or_none()
    if row is None:
        return None
    return Head(
        version=row.version, forgotten=row.forgotten, value=row.value, source=row.source, updated_at=row.updated_at
    )


async def write_if_version(
    db: AsyncSession, tenant_id: str, namespace: str, key: str, *, base: int, value: Any, source: str,
    provenance: dict[str, str] | None = None,
) -> Written | None:
    """Write `value` as version base+1 if the head is still at `base` (live or tombstone); None otherwise."""
    params = {
        **_pk(tenant_id, namespace, key), "base": base, "value": value, "source": source, "provenance": provenance
    }
    row = (await db.execute(_CAS_UPDATE, params)).one_or_none()
    return None if row is None else Written(version=row.version, updated_at=row.updated_at)


async def create_if_absent(
    db: AsyncSession, tenant_id: str, namespace: str, key: str, *, value: Any, source: str,
    provenance: dict[str, str] | None = None,
) -> Written | None:
    """Write version 1 if the key was never written (a tombstone counts as written); None otherwise."""
    params = {**_pk(tenant_id, namespace, key), "value": value, "source": source, "provenance": provenance}
    row = (await db.execute(_CREATE, params)).one_or_none()
    return None if row is None else Written(version=row.version, updated_at=row.updated_at)


async def tombstone(db: AsyncSession, tenant_id: str, namespace: str, key: str, *, source: str) -> Written | None:
    """Turn the head into a tombstone; its new version, or None when it already was one (row then locked)."""
    params = {**_pk(tenant_id, namespace, key), "source": source}
    row = (await db.execute(_TOMBSTONE, params)).one_or_none()
    return None if row is None else Written(version=row.version, updated_at=row.updated_at)


async def erase_history(
    db: AsyncSession, tenant_id: str, namespace: str, key: str, *, tombstone: Written, source: str
) -> int:
    """Record the tombstone in history and drop the value of every earlier version; the rows erased."""
    params = {
        **_pk(tenant_id, namespace, key),
        "version": tombstone.version,
        "source": source,
        "at": tombstone.updated_at,
    }
    result = await db.execute(_ERASE_HISTORY, params)
    return int(result.rowcount)  # type: ignore[attr-defined]


async def locked_state(db: AsyncSession, tenant_id: str, namespace: str, key: str) -> State | None:
    """The head's state, share-locked until the transaction ends so it cannot move under the caller."""
    row = (await db.execute(_LOCKED_STATE, _pk(tenant_id, namespace, key))).one_or_none()
    return None if row is None else State(version=row.version, forgotten=row.forgotten)


async def states(db: AsyncSession, tenant_id: str, namespace: str, keys: list[str]) -> dict[str, State]:
    """Current state of several keys (for reporting conflicts); keys never written are absent from the map."""
    rows = await db.execute(_STATES, {"tenant_id": tenant_id, "namespace": namespace, "keys": keys})
    return {row.key: State(version=row.version, forgotten=row.forgotten) for row in rows}


async def live_keys(db: AsyncSession, tenant_id: str, namespace: str, *, after: str | None, limit: int) -> list[str]:
    """Keyset page of keys that are not tombstones, in key order, strictly after `after`."""
    params: dict[str, Any] = {"tenant_id": tenant_id, "namespace": namespace, "limit": limit}
    if after is None:
        rows = await db.execute(_LIVE_KEYS_FIRST, params)
    else:
        rows = await db.execute(_LIVE_KEYS_AFTER, {**params, "after": after})
    return [row.key for row in rows]


async def history(db: AsyncSession, tenant_id: str, namespace: str, key: str) -> list[VersionRow]:
    rows = await db.execute(_HISTORY, _pk(tenant_id, namespace, key))
    return [VersionRow(version=r.version, op=r.op, source=r.source, at=r.at, value=r.value) for r in rows]


@dataclass(frozen=True)
class Injectable:
    key: str
    version: int
    value: Any


async def injectable(db: AsyncSession, tenant_id: str, namespace: str, *, limit: int) -> list[Injectable]:
    """The live records of a namespace, share-locked until the caller's transaction ends.

    The lock is the barrier between injecting a record into a new session and forgetting it: a tombstone waits for
    the session's commit, so its cascade job (queued with the tombstone) finds the session; a session created after
    the tombstone re-reads the row once the lock is free and sees the tombstone, so it never injects the value."""
    rows = await db.execute(_INJECTABLE, {"tenant_id": tenant_id, "namespace": namespace, "limit": limit})
    return [Injectable(key=r.key, version=r.version, value=r.value) for r in rows]


_DERIVED_FROM = text(
    """
    SELECT namespace, key FROM memory_records
     WHERE tenant_id = :tenant_id AND NOT forgotten AND provenance ->> 'artifact_id' = ANY(:artifact_ids)
     ORDER BY namespace, key
    """
)


async def derived_from(db: AsyncSession, tenant_id: str, artifact_ids: list[str]) -> list[tuple[str, str]]:
    """Live records whose value was written back from one of these artifacts (a session's summary)."""
    rows = await db.execute(_DERIVED_FROM, {"tenant_id": tenant_id, "artifact_ids": artifact_ids})
    return [(r.namespace, r.key) for r in rows]
