"""Deletes (a thread, runs, all but the latest), copies, and the rewrite of a thread's serialized values."""

from __future__ import annotations

from typing import Any

from app.db.statements import Row, Sql, Statement
from app.threads.repositories.locks import T, key

# Deletes record the ids they removed (with those of writes whose checkpoint never landed) before anything else can
# take the lock, then drop the blobs no remaining checkpoint uses.
_DELETE = """
    WITH gone AS (
        DELETE FROM thread_checkpoints c
         WHERE c.tenant_id = :tenant_id AND c.thread_id = ANY(CAST(:thread_ids AS text[]))
        {which}
        RETURNING c.thread_id, c.checkpoint_ns, c.checkpoint_id
    ),
    writes AS (
        DELETE FROM thread_writes w
         WHERE w.tenant_id = :tenant_id AND w.thread_id = ANY(CAST(:thread_ids AS text[])) {which_writes}
        RETURNING w.thread_id, w.checkpoint_id
    ),
    dead AS (
        INSERT INTO thread_deleted_checkpoints (tenant_id, thread_id, checkpoint_id)
        SELECT :tenant_id, thread_id, checkpoint_id FROM gone
         UNION SELECT :tenant_id, thread_id, checkpoint_id FROM writes
        ON CONFLICT DO NOTHING
    )
    SELECT count(*) AS deleted FROM gone
"""
_DELETE_ALL = Statement(_DELETE.format(which="", which_writes=""))
_DELETE_RUNS = Statement(_DELETE.format(
    which="AND c.metadata ->> 'run_id' = ANY(CAST(:run_ids AS text[]))",
    which_writes="""AND EXISTS (SELECT 1 FROM gone g WHERE g.thread_id = w.thread_id
                                  AND g.checkpoint_ns = w.checkpoint_ns AND g.checkpoint_id = w.checkpoint_id)""",
))
_DELETE_BUT_LATEST = Statement(_DELETE.format(
    which="""AND c.checkpoint_id < (SELECT max(l.checkpoint_id) FROM thread_checkpoints l
                                     WHERE l.tenant_id = c.tenant_id AND l.thread_id = c.thread_id
                                       AND l.checkpoint_ns = c.checkpoint_ns)""",
    which_writes="""AND EXISTS (SELECT 1 FROM gone g WHERE g.thread_id = w.thread_id
                                  AND g.checkpoint_ns = w.checkpoint_ns AND g.checkpoint_id = w.checkpoint_id)""",
))
_UNUSED_BLOBS = Statement(
    """
    DELETE FROM thread_blobs b
     WHERE b.tenant_id = :tenant_id AND b.thread_id = ANY(CAST(:thread_ids AS text[]))
       AND NOT EXISTS (SELECT 1 FROM thread_checkpoints c
                        WHERE c.tenant_id = b.tenant_id AND c.thread_id = b.thread_id
                          AND c.checkpoint_ns = b.checkpoint_ns AND c.versions ->> b.channel = b.version)
    """
)
_RUN_THREADS = Statement(
    """
    SELECT DISTINCT thread_id FROM thread_checkpoints
     WHERE tenant_id = :tenant_id AND metadata ->> 'run_id' = ANY(CAST(:run_ids AS text[]))
    """
)

_HAS_CHECKPOINTS = Statement(f"SELECT EXISTS (SELECT 1 FROM thread_checkpoints WHERE {T}) AS has")
_DEAD_AMONG_SOURCE = Statement(
    """
    SELECT EXISTS (
        SELECT 1 FROM thread_checkpoints c JOIN thread_deleted_checkpoints d
          ON d.tenant_id = c.tenant_id AND d.thread_id = :target_id AND d.checkpoint_id = c.checkpoint_id
         WHERE c.tenant_id = :tenant_id AND c.thread_id = :thread_id
    ) AS dead
    """
)
_COPY = Statement(
    f"""
    WITH cps AS (
        INSERT INTO thread_checkpoints
               (tenant_id, thread_id, checkpoint_ns, checkpoint_id, parent_id, type, checkpoint, metadata, versions,
                generation)
        SELECT tenant_id, CAST(:target_id AS varchar), checkpoint_ns, checkpoint_id, parent_id, type, checkpoint,
               metadata, versions,
               (SELECT t.generation FROM threads t
                 WHERE t.tenant_id = :tenant_id AND t.thread_id = CAST(:target_id AS varchar))
          FROM thread_checkpoints WHERE {T}
        ON CONFLICT DO NOTHING
        RETURNING 1
    ),
    blobs AS (
        INSERT INTO thread_blobs (tenant_id, thread_id, checkpoint_ns, channel, version, type, blob)
        SELECT tenant_id, CAST(:target_id AS varchar), checkpoint_ns, channel, version, type, blob
          FROM thread_blobs WHERE {T}
        ON CONFLICT DO NOTHING
    ),
    writes AS (
        INSERT INTO thread_writes
               (tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob, task_path)
        SELECT tenant_id, CAST(:target_id AS varchar), checkpoint_ns, checkpoint_id, task_id, idx, channel, type,
               blob, task_path
          FROM thread_writes WHERE {T}
        ON CONFLICT DO NOTHING
    )
    SELECT count(*) AS copied FROM cps
    """
)

_ALL_BLOBS = Statement(
    f"SELECT checkpoint_ns, channel, version, type, blob FROM thread_blobs WHERE {T} "
    "ORDER BY checkpoint_ns, channel, version"
)
_ALL_WRITES = Statement(
    f"SELECT checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob, task_path FROM thread_writes "
    f"WHERE {T} ORDER BY checkpoint_ns, checkpoint_id, task_path, task_id, idx"
)
_REPLACE_BLOBS = Statement(
    """
    UPDATE thread_blobs b SET type = u.type, blob = u.blob
      FROM unnest(CAST(:nss AS text[]), CAST(:channels AS text[]), CAST(:versions AS text[]),
                  CAST(:types AS text[]), CAST(:blobs AS bytea[])) AS u(ns, channel, version, type, blob)
     WHERE b.tenant_id = :tenant_id AND b.thread_id = :thread_id AND b.checkpoint_ns = u.ns AND b.channel = u.channel
       AND b.version = u.version
    """
)
_REPLACE_WRITES = Statement(
    """
    UPDATE thread_writes w SET type = u.type, blob = u.blob
      FROM unnest(CAST(:nss AS text[]), CAST(:checkpoint_ids AS text[]), CAST(:task_ids AS text[]),
                  CAST(:idxs AS int[]), CAST(:types AS text[]), CAST(:blobs AS bytea[]))
           AS u(ns, checkpoint_id, task_id, idx, type, blob)
     WHERE w.tenant_id = :tenant_id AND w.thread_id = :thread_id AND w.checkpoint_ns = u.ns
       AND w.checkpoint_id = u.checkpoint_id
       AND w.task_id = u.task_id AND w.idx = u.idx
    """
)
_DROP_WRITES = Statement(
    """
    DELETE FROM thread_writes w
     USING unnest(CAST(:nss AS text[]), CAST(:checkpoint_ids AS text[]), CAST(:task_ids AS text[]),
                  CAST(:idxs AS int[])) AS u(ns, checkpoint_id, task_id, idx)
     WHERE w.tenant_id = :tenant_id AND w.thread_id = :thread_id AND w.checkpoint_ns = u.ns
       AND w.checkpoint_id = u.checkpoint_id
       AND w.task_id = u.task_id AND w.idx = u.idx
    """
)
_NEXT_GENERATION = Statement(f"UPDATE threads SET generation = generation + 1 WHERE {T} RETURNING generation")



async def delete(sql: Sql, tenant_id: str, thread_ids: list[str]) -> int:
    """Every checkpoint, blob and write of these (locked) threads; answers how many checkpoints went."""
    params = {"tenant_id": tenant_id, "thread_ids": thread_ids}
    row = await sql.one(_DELETE_ALL, params)
    await sql.rowcount(_UNUSED_BLOBS, params)
    return 0 if row is None else int(row["deleted"])


async def threads_of_runs(sql: Sql, tenant_id: str, run_ids: list[str]) -> list[str]:
    rows = await sql.all(_RUN_THREADS, {"tenant_id": tenant_id, "run_ids": run_ids})
    return [row["thread_id"] for row in rows]


async def delete_runs(sql: Sql, tenant_id: str, thread_ids: list[str], run_ids: list[str]) -> int:
    params = {"tenant_id": tenant_id, "thread_ids": thread_ids}
    row = await sql.one(_DELETE_RUNS, {**params, "run_ids": run_ids})
    await sql.rowcount(_UNUSED_BLOBS, params)
    return 0 if row is None else int(row["deleted"])


async def delete_all_but_latest(sql: Sql, tenant_id: str, thread_ids: list[str]) -> int:
    params = {"tenant_id": tenant_id, "thread_ids": thread_ids}
    row = await sql.one(_DELETE_BUT_LATEST, params)
    await sql.rowcount(_UNUSED_BLOBS, params)
    return 0 if row is None else int(row["deleted"])


async def has_checkpoints(sql: Sql, tenant_id: str, thread_id: str) -> bool:
    row = await sql.one(_HAS_CHECKPOINTS, key(tenant_id, thread_id))
    return row is not None and bool(row["has"])


async def copy(sql: Sql, tenant_id: str, thread_id: str, target_id: str) -> int | None:
    """Copy every checkpoint, blob and write to `target_id`; None (nothing copied) when one of the checkpoints was
    deleted from the target before."""
    params = {**key(tenant_id, thread_id), "target_id": target_id}
    dead = await sql.one(_DEAD_AMONG_SOURCE, params)
    if dead is not None and dead["dead"]:
        return None
    row = await sql.one(_COPY, params)
    return 0 if row is None else int(row["copied"])


async def all_blobs(sql: Sql, tenant_id: str, thread_id: str) -> list[Row]:
    return await sql.all(_ALL_BLOBS, key(tenant_id, thread_id))


async def all_writes(sql: Sql, tenant_id: str, thread_id: str) -> list[Row]:
    return await sql.all(_ALL_WRITES, key(tenant_id, thread_id))


async def replace(
    sql: Sql, tenant_id: str, thread_id: str, *, blobs: list[tuple[str, str, str, str, bytes]],
    writes: list[tuple[str, str, str, int, str, bytes]], dropped: list[tuple[str, str, str, int]],
) -> int:
    """Replace blobs (ns, channel, version, type, data) and writes (ns, checkpoint, task, idx, type, data), drop
    writes (ns, checkpoint, task, idx); answers the thread's new generation."""
    thread = key(tenant_id, thread_id)
    if blobs:
        await sql.rowcount(_REPLACE_BLOBS, {
            **thread, **_columns(blobs, ["nss", "channels", "versions", "types", "blobs"]),
        })
    if writes:
        await sql.rowcount(_REPLACE_WRITES, {
            **thread, **_columns(writes, ["nss", "checkpoint_ids", "task_ids", "idxs", "types", "blobs"]),
        })
    if dropped:
        await sql.rowcount(_DROP_WRITES, {**thread, **_columns(dropped, ["nss", "checkpoint_ids", "task_ids", "idxs"])})
    row = await sql.one(_NEXT_GENERATION, thread)
    assert row is not None  # the caller holds the thread's lock
    return int(row["generation"])


def _columns(rows: list[Any], names: list[str]) -> dict[str, list[Any]]:
    return {name: [r[i] for r in rows] for i, name in enumerate(names)}

