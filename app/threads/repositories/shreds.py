"""Leaves the thread routes removed, waiting to be shredded (`thread_pending_shreds`, migration 0020).

A removal (a thread deleted, runs deleted, a prune, a rewrite, a put replacing a checkpoint) records its leaves in
its own transaction, so they are never lost between its commit and the shred: the route shreds them right after the
commit and deletes the record; with the key provider down the record stays, and the forget worker's shred sweep
(app/forget/shredding.py) retries it. The thread routes create no forget jobs, so this is their `shred_leaves`.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.db.statements import Sql, Statement

_RECORD = Statement(
    "INSERT INTO thread_pending_shreds (tenant_id, leaves) VALUES (:tenant_id, CAST(:leaves AS bigint[])) RETURNING id"
)
_DONE = Statement("DELETE FROM thread_pending_shreds WHERE id = :id")
_PENDING = Statement("SELECT id, tenant_id, leaves FROM thread_pending_shreds ORDER BY id LIMIT :limit")
_PENDING_BY_TENANT = Statement(
    """
    SELECT tenant_id, count(*) AS records, EXTRACT(EPOCH FROM clock_timestamp() - min(created_at)) AS oldest_s
      FROM thread_pending_shreds GROUP BY tenant_id
    """
)


@dataclass(frozen=True)
class PendingShred:
    id: int
    tenant_id: str
    leaves: list[int]


async def record(sql: Sql, tenant_id: str, leaves: list[int]) -> PendingShred | None:
    """Record `leaves` to shred once the caller's transaction committed; None when there are none."""
    wanted = sorted(set(leaves))
    if not wanted:
        return None
    row = await sql.one(_RECORD, {"tenant_id": tenant_id, "leaves": wanted})
    assert row is not None  # an INSERT ... RETURNING answers its row
    return PendingShred(int(row["id"]), tenant_id, wanted)


async def done(sql: Sql, shred_id: int) -> None:
    await sql.rowcount(_DONE, {"id": shred_id})


async def pending(sql: Sql, *, limit: int) -> list[PendingShred]:
    rows = await sql.all(_PENDING, {"limit": limit})
    return [PendingShred(int(r["id"]), r["tenant_id"], list(r["leaves"])) for r in rows]


async def pending_by_tenant(sql: Sql) -> dict[str, tuple[int, float]]:
    """Per tenant with any: how many removals' shreds are pending, and the oldest one's age in seconds
    (`lethe keys status` adds them to the forget jobs' pending shreds)."""
    return {r["tenant_id"]: (int(r["records"]), float(r["oldest_s"])) for r in await sql.all(_PENDING_BY_TENANT, {})}
