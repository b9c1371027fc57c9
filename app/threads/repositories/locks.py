"""The thread row: locked first by every write of a thread (the barrier, see the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.db.statements import Row, Sql, Statement


@dataclass(frozen=True)
class Locked:
    revision: int
    generation: int


T = "tenant_id = :tenant_id AND thread_id = :thread_id"

# Bumps the revision: a rewrite that read an older one is refused (app/threads/service.py `rewrite`).
_LOCK = Statement(
    """
    INSERT INTO threads (tenant_id, thread_id, revision, generation, updated_at)
    VALUES (:tenant_id, :thread_id, 1, 0, clock_timestamp())
    ON CONFLICT (tenant_id, thread_id) DO UPDATE
       SET revision = threads.revision + 1, updated_at = clock_timestamp()
    RETURNING revision, generation
    """
)
_LOCK_EXISTING = Statement(
    f"""
    UPDATE threads SET revision = revision + 1, updated_at = clock_timestamp() WHERE {T}
    RETURNING revision, generation
    """
)
# Several threads in one unit of work: locked in id order, so two of them never wait on each other in a cycle.
_LOCK_MANY = Statement(
    """
    SELECT thread_id FROM threads
     WHERE tenant_id = :tenant_id AND thread_id = ANY(CAST(:thread_ids AS text[]))
     ORDER BY thread_id
       FOR UPDATE
    """
)
_BUMP_MANY = Statement(
    """
    UPDATE threads SET revision = revision + 1, updated_at = clock_timestamp()
     WHERE tenant_id = :tenant_id AND thread_id = ANY(CAST(:thread_ids AS text[]))
    """
)

_GENERATION = Statement(f"SELECT revision, generation FROM threads WHERE {T}")


def key(tenant_id: str, thread_id: str) -> dict[str, Any]:
    return {"tenant_id": tenant_id, "thread_id": thread_id}


def _locked(row: Row | None) -> Locked | None:
    return None if row is None else Locked(revision=row["revision"], generation=row["generation"])


async def lock(sql: Sql, tenant_id: str, thread_id: str) -> Locked:
    """Lock the thread's row for this transaction, creating it on a first write."""
    found = _locked(await sql.one(_LOCK, key(tenant_id, thread_id)))
    assert found is not None  # an upsert always returns its row
    return found


async def lock_existing(sql: Sql, tenant_id: str, thread_id: str) -> Locked | None:
    return _locked(await sql.one(_LOCK_EXISTING, key(tenant_id, thread_id)))


async def lock_many(sql: Sql, tenant_id: str, thread_ids: list[str]) -> list[str]:
    """Lock the threads of this list that exist; answers their ids."""
    params = {"tenant_id": tenant_id, "thread_ids": thread_ids}
    found = [row["thread_id"] for row in await sql.all(_LOCK_MANY, params)]
    await sql.rowcount(_BUMP_MANY, {"tenant_id": tenant_id, "thread_ids": found})
    return found


async def state(sql: Sql, tenant_id: str, thread_id: str) -> Locked | None:
    return _locked(await sql.one(_GENERATION, key(tenant_id, thread_id)))


