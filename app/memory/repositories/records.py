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

Functions take `Sql` (app/db/statements.py): the HTTP hot path runs them on a plain asyncpg connection, one
statement per autocommit, and callers with a unit of work open (a forget job, a new session injecting records) run
them in their ORM transaction. Those that write or read values take the process's `Sealer` too: values are stored
sealed (`sealing.py`) and come out of here as JSON values, or as erased when a forget shredded their leaf.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.db.statements import Row, Sql, Statement
from app.keys.content import Sealer
from app.memory.repositories.sealing import RECORDS, VERSIONS, Sealed, open_value, seal_version


@dataclass(frozen=True)
class Head:
    """The newest version of a key; `value` is None for a tombstone. `expired`: its time to live ran out (by the
    database's clock) and nobody has tombstoned it yet. `erased`: a live row whose leaf a forget shredded (a
    backup restored from before the forget): it reads as forgotten."""

    version: int
    forgotten: bool
    value: Any
    erased: bool
    source: str
    updated_at: datetime
    created_at: datetime
    expires_at: datetime | None
    expired: bool


@dataclass(frozen=True)
class Written:
    version: int
    updated_at: datetime


@dataclass(frozen=True)
class State:
    """Where a key stands: version 0 means never written."""

    version: int
    forgotten: bool
    expired: bool = False


@dataclass(frozen=True)
class VersionRow:
    version: int
    op: str
    source: str
    at: datetime
    value: Any
    erased: bool  # a sealed value whose leaf was shredded


_PK = "tenant_id = :tenant_id AND namespace = :namespace AND key = :key"
# Timestamps use clock_timestamp(), not now(): now() is the transaction's start, so a write that waited on the row
# lock would be stamped earlier than the version it superseded.

# A record whose time to live ran out is not live, whether or not it was tombstoned yet (the sweep or the first read
# that meets it does that); expiry is judged by the database's clock, never a client's.
EXPIRED = "(expires_at IS NOT NULL AND expires_at <= clock_timestamp())"
LIVE = f"NOT forgotten AND NOT {EXPIRED}"
# A write restarts the key's time to live (`:ttl_s` NULL: it never expires).
_EXPIRES = "clock_timestamp() + make_interval(secs => :ttl_s)"

# The history row is built from RETURNING, so it carries exactly the version the head got (the one both
# ciphertexts were sealed for: a compare-and-set knows it in advance).
_HISTORY_FROM_HEAD = """
    hist AS (
        INSERT INTO memory_versions (tenant_id, namespace, key, version, op, value_sealed, leaf, source, at)
        SELECT tenant_id, namespace, key, version, 'write', :history_sealed, leaf, source, updated_at FROM head
    )
    SELECT version, updated_at FROM head
"""

# Which incarnation a write extends: read before sealing. If the compare-and-set then lands, the head was still at
# this version, and a version names one state of the row: the leaf read is the incarnation's.
_INCARNATION = Statement(f"SELECT version, forgotten, leaf FROM memory_records WHERE {_PK}")

_CAS_UPDATE = Statement(
    f"""
    WITH head AS (
        UPDATE memory_records
           SET version = version + 1, value = NULL, value_sealed = :head_sealed, leaf = :leaf, forgotten = false,
               source = :source, provenance = :provenance, updated_at = clock_timestamp(),
               created_at = CASE WHEN forgotten THEN clock_timestamp() ELSE created_at END,
               ttl_s = :ttl_s, expires_at = {_EXPIRES}
         WHERE {_PK} AND version = :base AND NOT {EXPIRED}
        RETURNING tenant_id, namespace, key, version, leaf, source, updated_at
    ),
    {_HISTORY_FROM_HEAD}
    """,
    json=["provenance"],
)

_CREATE = Statement(
    f"""
    WITH head AS (
        INSERT INTO memory_records
               (tenant_id, namespace, key, version, value_sealed, leaf, forgotten, source, provenance, updated_at,
                created_at, ttl_s, expires_at)
        VALUES (:tenant_id, :namespace, :key, 1, :head_sealed, :leaf, false, :source, :provenance, clock_timestamp(),
                clock_timestamp(), :ttl_s, {_EXPIRES})
        ON CONFLICT (tenant_id, namespace, key) DO NOTHING
        RETURNING tenant_id, namespace, key, version, leaf, source, updated_at
    ),
    {_HISTORY_FROM_HEAD}
    """,
    json=["provenance"],
)

# A never-written key gets tombstone version 1, so a stale "create if absent" cannot land after the forget.
# On an existing key the upsert locks the row even when the WHERE (already a tombstone) leaves it unchanged.
_TOMBSTONE = Statement(
    """
    INSERT INTO memory_records (tenant_id, namespace, key, version, value, forgotten, source, updated_at)
    VALUES (:tenant_id, :namespace, :key, 1, NULL, true, :source, clock_timestamp())
    ON CONFLICT (tenant_id, namespace, key) DO UPDATE
       SET version = memory_records.version + 1, value = NULL, value_sealed = NULL, leaf = NULL, forgotten = true,
           source = EXCLUDED.source, provenance = NULL, updated_at = clock_timestamp(), ttl_s = NULL, expires_at = NULL
     WHERE NOT memory_records.forgotten
    RETURNING version, updated_at
    """
)

# The tombstone of a record whose time to live ran out, and of no other: a write or a refresh that beat the sweep
# leaves the row live, and this matches nothing.
_EXPIRE = Statement(
    f"""
    UPDATE memory_records
       SET version = version + 1, value = NULL, value_sealed = NULL, leaf = NULL, forgotten = true, source = :source,
           provenance = NULL, updated_at = clock_timestamp(), ttl_s = NULL, expires_at = NULL
     WHERE {_PK} AND NOT forgotten AND {EXPIRED}
    RETURNING version, updated_at
    """
)

# The rows erased answer their leaves (kept on the row: a number, no content), the ones the forget must shred.
_ERASE_HISTORY = Statement(
    f"""
    WITH tomb AS (
        INSERT INTO memory_versions (tenant_id, namespace, key, version, op, value, source, at)
        VALUES (:tenant_id, :namespace, :key, :version, 'forget', NULL, :source, :at)
    ),
    erased AS (
        UPDATE memory_versions SET value = NULL, value_sealed = NULL
         WHERE {_PK} AND version < :version AND (value IS NOT NULL OR value_sealed IS NOT NULL)
        RETURNING leaf
    )
    SELECT leaf FROM erased
    """
)

_HEAD = Statement(
    f"""SELECT version, forgotten, value, value_sealed, source, updated_at, created_at, expires_at,
               {EXPIRED} AS expired
          FROM memory_records WHERE {_PK}""",
    json=["value"],
)

_LOCKED_STATE = Statement(f"SELECT version, forgotten FROM memory_records WHERE {_PK} FOR SHARE")

_STATES = Statement(
    f"""
    SELECT key, version, forgotten, {EXPIRED} AS expired FROM memory_records
     WHERE tenant_id = :tenant_id AND namespace = :namespace AND key = ANY(:keys)
    """
)

# Two statements rather than `(:after IS NULL OR key > :after)`, which would keep the planner off the PK range scan.
_LIVE_KEYS_SQL = f"""
    SELECT key, leaf FROM memory_records
     WHERE tenant_id = :tenant_id AND namespace = :namespace AND {LIVE} {{after}}
     ORDER BY key
     LIMIT :limit
"""
_LIVE_KEYS_FIRST = Statement(_LIVE_KEYS_SQL.format(after=""))
_LIVE_KEYS_AFTER = Statement(_LIVE_KEYS_SQL.format(after="AND key > :after"))

# FOR SHARE: a session injecting these records and a forget tombstoning one of them serialize (see `injectable`).
_INJECTABLE = Statement(
    f"""
    SELECT key, version, value, value_sealed FROM memory_records
     WHERE tenant_id = :tenant_id AND namespace = :namespace AND {LIVE}
     ORDER BY key
     LIMIT :limit
       FOR SHARE
    """,
    json=["value"],
)

_HISTORY = Statement(
    f"SELECT version, op, source, at, value, value_sealed FROM memory_versions WHERE {_PK} ORDER BY version",
    json=["value"],
)


def _pk(tenant_id: str, namespace: str, key: str) -> dict[str, str]:
    return {"tenant_id": tenant_id, "namespace": namespace, "key": key}


def _written(row: Row | None) -> Written | None:
    return None if row is None else Written(version=row["version"], updated_at=row["updated_at"])


def _write_params(
    tenant_id: str, namespace: str, key: str, sealed: Sealed, source: str, provenance: dict[str, str] | None,
    ttl_s: float | None,
) -> dict[str, Any]:
    return {
        **_pk(tenant_id, namespace, key), "head_sealed": sealed.head, "history_sealed": sealed.history,
        "leaf": sealed.leaf, "source": source, "provenance": provenance,
        "ttl_s": None if ttl_s is None else float(ttl_s),
    }


async def get_head(db: Sql, sealer: Sealer, tenant_id: str, namespace: str, key: str) -> Head | None:
    row = await db.one(_HEAD, _pk(tenant_id, namespace, key))
    if row is None:
        return None
    opened = await open_value(sealer, tenant_id, RECORDS, namespace, key, row)
    return Head(
        version=row["version"], forgotten=row["forgotten"], value=opened.value, erased=opened.erased,
        source=row["source"], updated_at=row["updated_at"], created_at=row["created_at"],
        expires_at=row["expires_at"], expired=row["expired"],
    )


async def write_if_version(
    db: Sql, sealer: Sealer, tenant_id: str, namespace: str, key: str, *, base: int, value: Any, source: str,
    provenance: dict[str, str] | None = None, ttl_s: float | None = None,
) -> Written | None:
    """Write `value` as version base+1 if the head is still at `base` (live or tombstone, never expired); None
    otherwise. `ttl_s`: the new version expires that many seconds from now (None: never). Over a live head the
    value joins its incarnation's leaf; over a tombstone it starts a new incarnation under a new leaf."""
    head = await db.one(_INCARNATION, _pk(tenant_id, namespace, key))
    if head is None or head["version"] != base:
        return None  # the compare-and-set would not land: seal nothing
    leaf = None if head["forgotten"] else head["leaf"]
    sealed = await seal_version(sealer, tenant_id, namespace, key, base + 1, value, leaf=leaf)
    params = _write_params(tenant_id, namespace, key, sealed, source, provenance, ttl_s)
    return _written(await db.one(_CAS_UPDATE, {**params, "base": base}))


async def create_if_absent(
    db: Sql, sealer: Sealer, tenant_id: str, namespace: str, key: str, *, value: Any, source: str,
    provenance: dict[str, str] | None = None, ttl_s: float | None = None,
) -> Written | None:
    """Write version 1, the first incarnation under a new leaf, if the key was never written (a tombstone counts as
    written); None otherwise (the leaf taken is then skipped, never reused)."""
    sealed = await seal_version(sealer, tenant_id, namespace, key, 1, value, leaf=None)
    return _written(await db.one(_CREATE, _write_params(tenant_id, namespace, key, sealed, source, provenance, ttl_s)))


async def tombstone(db: Sql, tenant_id: str, namespace: str, key: str, *, source: str) -> Written | None:
    """Turn the head into a tombstone; its new version, or None when it already was one (row then locked)."""
    return _written(await db.one(_TOMBSTONE, {**_pk(tenant_id, namespace, key), "source": source}))


async def expire(db: Sql, tenant_id: str, namespace: str, key: str, *, source: str) -> Written | None:
    """Tombstone the key if its time to live ran out; its new version, or None when it had not (or was already a
    tombstone)."""
    return _written(await db.one(_EXPIRE, {**_pk(tenant_id, namespace, key), "source": source}))


@dataclass(frozen=True)
class ErasedHistory:
    """What a forget erased from history: how many values, the leaves the sealed ones were under (to shred), and
    how many were plaintext written before migration 0016 (their dead tuples stay on disk: no shred reaches them)."""

    rows: int
    leaves: list[int]
    plaintext: int


async def erase_history(
    db: Sql, tenant_id: str, namespace: str, key: str, *, tombstone: Written, source: str
) -> ErasedHistory:
    """Record the tombstone in history and drop the value of every earlier version."""
    params = {
        **_pk(tenant_id, namespace, key),
        "version": tombstone.version,
        "source": source,
        "at": tombstone.updated_at,
    }
    rows = await db.all(_ERASE_HISTORY, params)
    leaves = [r["leaf"] for r in rows if r["leaf"] is not None]
    return ErasedHistory(rows=len(rows), leaves=sorted(set(leaves)), plaintext=len(rows) - len(leaves))


async def locked_state(db: Sql, tenant_id: str, namespace: str, key: str) -> State | None:
    """The head's state, share-locked until the transaction ends so it cannot move under the caller."""
    row = await db.one(_LOCKED_STATE, _pk(tenant_id, namespace, key))
    return None if row is None else State(version=row["version"], forgotten=row["forgotten"])


async def states(db: Sql, tenant_id: str, namespace: str, keys: list[str]) -> dict[str, State]:
    """Current state of several keys (for reporting conflicts); keys never written are absent from the map."""
    rows = await db.all(_STATES, {"tenant_id": tenant_id, "namespace": namespace, "keys": keys})
    return {
        row["key"]: State(version=row["version"], forgotten=row["forgotten"], expired=row["expired"]) for row in rows
    }


@dataclass(frozen=True)
class ListedKey:
    key: str
    erased: bool  # its leaf was shredded: it reads as forgotten


async def live_keys(
    db: Sql, sealer: Sealer, tenant_id: str, namespace: str, *, after: str | None, limit: int
) -> list[ListedKey]:
    """Keyset page of keys that are not tombstones, in key order, strictly after `after`; whether each one's leaf
    was shredded is told from its leaf, without opening a value."""
    params: dict[str, Any] = {"tenant_id": tenant_id, "namespace": namespace, "limit": limit}
    if after is None:
        rows = await db.all(_LIVE_KEYS_FIRST, params)
    else:
        rows = await db.all(_LIVE_KEYS_AFTER, {**params, "after": after})
    punctured = await sealer.punctured(tenant_id, [r["leaf"] for r in rows if r["leaf"] is not None])
    return [ListedKey(key=r["key"], erased=r["leaf"] in punctured) for r in rows]


async def history(db: Sql, sealer: Sealer, tenant_id: str, namespace: str, key: str) -> list[VersionRow]:
    out = []
    for r in await db.all(_HISTORY, _pk(tenant_id, namespace, key)):
        opened = await open_value(sealer, tenant_id, VERSIONS, namespace, key, r)
        out.append(VersionRow(
            version=r["version"], op=r["op"], source=r["source"], at=r["at"], value=opened.value,
            erased=opened.erased,
        ))
    return out


@dataclass(frozen=True)
class Injectable:
    key: str
    version: int
    value: Any


async def injectable(db: Sql, sealer: Sealer, tenant_id: str, namespace: str, *, limit: int) -> list[Injectable]:
    """The live records of a namespace, share-locked until the caller's transaction ends; a record whose leaf was
    shredded is left out (no session ever sees a ciphertext, nor an erased value).

    The lock is the barrier between injecting a record into a new session and forgetting it: a tombstone waits for
    the session's commit, so its cascade job (queued with the tombstone) finds the session; a session created after
    the tombstone re-reads the row once the lock is free and sees the tombstone, so it never injects the value."""
    out = []
    for r in await db.all(_INJECTABLE, {"tenant_id": tenant_id, "namespace": namespace, "limit": limit}):
        opened = await open_value(sealer, tenant_id, RECORDS, namespace, r["key"], r)
        if not opened.erased:
            out.append(Injectable(key=r["key"], version=r["version"], value=opened.value))
    return out


_DERIVED_FROM = Statement(
    """
    SELECT namespace, key FROM memory_records
     WHERE tenant_id = :tenant_id AND NOT forgotten AND provenance ->> 'artifact_id' = ANY(:artifact_ids)
     ORDER BY namespace, key
    """
)


async def derived_from(db: Sql, tenant_id: str, artifact_ids: list[str]) -> list[tuple[str, str]]:
    """Live records whose value was written back from one of these artifacts (a session's summary)."""
    rows = await db.all(_DERIVED_FROM, {"tenant_id": tenant_id, "artifact_ids": artifact_ids})
    return [(r["namespace"], r["key"]) for r in rows]
