"""Checkpoints, their blobs and their pending writes: stored, and read one or a page at a time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.db.statements import Row, Sql, Statement
from app.threads.repositories.locks import T, key


@dataclass(frozen=True)
class Blob:
    channel: str
    version: str
    type: str
    data: bytes


@dataclass(frozen=True)
class Write:
    task_id: str
    idx: int
    channel: str
    type: str
    data: bytes
    task_path: str


@dataclass(frozen=True)
class Stored:
    """One checkpoint as stored, with the blobs of its channel versions and its pending writes."""

    checkpoint_ns: str
    checkpoint_id: str
    parent_id: str | None
    type: str
    checkpoint: bytes
    metadata: dict[str, Any]
    blobs: list[Blob]
    writes: list[Write]
    generation: int  # the thread's, when read: a writer building on this checkpoint names it



_DEAD = f"""
    dead AS (SELECT 1 FROM thread_deleted_checkpoints
              WHERE {T} AND checkpoint_id = ANY(CAST(:checks AS text[])) LIMIT 1)
"""

# A checkpoint and its new blobs in one statement, unless the checkpoint or its parent was deleted; a put of an id
# already stored replaces it (LangGraph re-puts a checkpoint it updates, as PostgresSaver allows).
_PUT = Statement(
    f"""
    WITH {_DEAD},
    blobs AS (
        INSERT INTO thread_blobs (tenant_id, thread_id, checkpoint_ns, channel, version, type, blob)
        SELECT :tenant_id, :thread_id, :checkpoint_ns, u.channel, u.version, u.type, u.blob
          FROM unnest(CAST(:channels AS text[]), CAST(:versions AS text[]), CAST(:types AS text[]),
                      CAST(:blobs AS bytea[])) AS u(channel, version, type, blob)
         WHERE NOT EXISTS (SELECT 1 FROM dead)
        ON CONFLICT DO NOTHING
    ),
    cp AS (
        INSERT INTO thread_checkpoints
               (tenant_id, thread_id, checkpoint_ns, checkpoint_id, parent_id, type, checkpoint, metadata, versions,
                generation)
        SELECT :tenant_id, :thread_id, :checkpoint_ns, :checkpoint_id, :parent_id, :type, :checkpoint, :metadata,
               :channel_versions, :generation
         WHERE NOT EXISTS (SELECT 1 FROM dead)
        ON CONFLICT (tenant_id, thread_id, checkpoint_ns, checkpoint_id) DO UPDATE
           SET parent_id = EXCLUDED.parent_id, type = EXCLUDED.type, checkpoint = EXCLUDED.checkpoint,
               metadata = EXCLUDED.metadata, versions = EXCLUDED.versions, generation = EXCLUDED.generation
        RETURNING 1
    )
    SELECT count(*) AS stored FROM cp
    """,
    json=["metadata", "channel_versions"],
)

# Regular writes (idx >= 0) are kept as first written, special ones (ERROR, INTERRUPT...: idx < 0) replaced, as in
# LangGraph's own savers.
_PUT_WRITES = Statement(
    f"""
    WITH {_DEAD},
    ins AS (
        INSERT INTO thread_writes
               (tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob, task_path)
        SELECT :tenant_id, :thread_id, :checkpoint_ns, :checkpoint_id, :task_id, u.idx, u.channel, u.type, u.blob,
               :task_path
          FROM unnest(CAST(:idxs AS int[]), CAST(:channels AS text[]), CAST(:types AS text[]),
                      CAST(:blobs AS bytea[])) AS u(idx, channel, type, blob)
         WHERE NOT EXISTS (SELECT 1 FROM dead)
        ON CONFLICT (tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE
           SET channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob, task_path = EXCLUDED.task_path
         WHERE thread_writes.idx < 0
    )
    SELECT NOT EXISTS (SELECT 1 FROM dead) AS stored
    """
)

# A refused put's checkpoint joins the deleted ids, and the writes that reached it first go with it.
_BURY = Statement(
    f"""
    WITH w AS (DELETE FROM thread_writes WHERE {T} AND checkpoint_id = :checkpoint_id)
    INSERT INTO thread_deleted_checkpoints (tenant_id, thread_id, checkpoint_id)
    VALUES (:tenant_id, :thread_id, :checkpoint_id)
    ON CONFLICT DO NOTHING
    """
)

# One checkpoint or a page of them, newest first, each with its blobs and its writes in `writes_sort_key` order.
# The page is chosen first (an index scan of the primary key, newest first) and only its rows are filled in: filled
# before the LIMIT, every checkpoint of the thread would be.
_SELECT = """
    WITH page AS (
        SELECT c.* FROM thread_checkpoints c
         WHERE c.tenant_id = :tenant_id AND c.thread_id = :thread_id {where}
         ORDER BY {order}
         LIMIT :limit
    )
    SELECT c.checkpoint_ns, c.checkpoint_id, c.parent_id, c.type, c.checkpoint, c.metadata,
           (SELECT t.generation FROM threads t WHERE t.tenant_id = c.tenant_id AND t.thread_id = c.thread_id)
               AS generation,
           b.channels, b.versions, b.types, b.blobs,
           w.task_ids, w.idxs, w.channels AS w_channels, w.types AS w_types, w.blobs AS w_blobs, w.paths
      FROM page c
      LEFT JOIN LATERAL (
        SELECT array_agg(tb.channel) AS channels, array_agg(tb.version) AS versions, array_agg(tb.type) AS types,
               array_agg(tb.blob) AS blobs
          FROM jsonb_each_text(c.versions) v
          JOIN thread_blobs tb
            ON tb.tenant_id = c.tenant_id AND tb.thread_id = c.thread_id AND tb.checkpoint_ns = c.checkpoint_ns
           AND tb.channel = v.key AND tb.version = v.value
      ) b ON true
      LEFT JOIN LATERAL (
        SELECT array_agg(tw.task_id ORDER BY tw.task_path, tw.task_id, tw.idx) AS task_ids,
               array_agg(tw.idx ORDER BY tw.task_path, tw.task_id, tw.idx) AS idxs,
               array_agg(tw.channel ORDER BY tw.task_path, tw.task_id, tw.idx) AS channels,
               array_agg(tw.type ORDER BY tw.task_path, tw.task_id, tw.idx) AS types,
               array_agg(tw.blob ORDER BY tw.task_path, tw.task_id, tw.idx) AS blobs,
               array_agg(tw.task_path ORDER BY tw.task_path, tw.task_id, tw.idx) AS paths
          FROM thread_writes tw
         WHERE tw.tenant_id = c.tenant_id AND tw.thread_id = c.thread_id AND tw.checkpoint_ns = c.checkpoint_ns
           AND tw.checkpoint_id = c.checkpoint_id
      ) w ON true
     ORDER BY {order}
"""
_FILTERS = """
       AND (CAST(:before AS text) IS NULL OR c.checkpoint_id < CAST(:before AS text))
       AND c.metadata @> :filter
"""
_ONE = Statement(
    _SELECT.format(where="AND c.checkpoint_ns = :checkpoint_ns AND c.checkpoint_id = :checkpoint_id",
                   order="c.checkpoint_id DESC"),
    json=["metadata"],
)
# One namespace (what LangGraph asks for): a backward scan of the primary key. `after_id` is a page's cursor.
_PAGE_NS = Statement(
    _SELECT.format(where="AND c.checkpoint_ns = :checkpoint_ns" + _FILTERS
                   + "AND (CAST(:after_id AS text) IS NULL OR c.checkpoint_id < CAST(:after_id AS text))",
                   order="c.checkpoint_id DESC"),
    json=["metadata", "filter"],
)
# Every namespace, newest first across them; `before` is LangGraph's (every checkpoint older than that id).
_PAGE_ALL = Statement(
    _SELECT.format(where=_FILTERS + """
       AND (CAST(:after_id AS text) IS NULL
            OR (c.checkpoint_id, c.checkpoint_ns) < (CAST(:after_id AS text), CAST(:after_ns AS text)))""",
                   order="c.checkpoint_id DESC, c.checkpoint_ns DESC"),
    json=["metadata", "filter"],
)

async def put(
    sql: Sql, tenant_id: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str, parent_id: str | None, *,
    type: str, checkpoint: bytes, metadata: dict[str, Any], channel_versions: dict[str, str], blobs: list[Blob],
    generation: int,
) -> bool:
    """Store a checkpoint with its new blobs; False (nothing stored) when it or its parent was deleted."""
    row = await sql.one(_PUT, {
        **key(tenant_id, thread_id), "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id,
        "parent_id": parent_id, "checks": [checkpoint_id] + ([parent_id] if parent_id else []),
        "type": type, "checkpoint": checkpoint, "metadata": metadata, "channel_versions": channel_versions,
        "generation": generation,
        "channels": [b.channel for b in blobs], "versions": [b.version for b in blobs],
        "types": [b.type for b in blobs], "blobs": [b.data for b in blobs],
    })
    return row is not None and row["stored"] == 1


async def bury(sql: Sql, tenant_id: str, thread_id: str, checkpoint_id: str) -> None:
    await sql.rowcount(_BURY, {**key(tenant_id, thread_id), "checkpoint_id": checkpoint_id})


async def put_writes(
    sql: Sql, tenant_id: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str, task_id: str, task_path: str,
    writes: list[tuple[int, str, str, bytes]],
) -> bool:
    """Store (idx, channel, type, data) writes; False (nothing stored) when the checkpoint was deleted."""
    row = await sql.one(_PUT_WRITES, {
        **key(tenant_id, thread_id), "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id,
        "checks": [checkpoint_id], "task_id": task_id, "task_path": task_path,
        "idxs": [w[0] for w in writes], "channels": [w[1] for w in writes], "types": [w[2] for w in writes],
        "blobs": [w[3] for w in writes],
    })
    return row is not None and bool(row["stored"])


def _stored(row: Row) -> Stored:
    blobs = [Blob(*fields) for fields in zip(
        row["channels"] or [], row["versions"] or [], row["types"] or [], row["blobs"] or [], strict=True
    )]
    writes = [Write(*fields) for fields in zip(
        row["task_ids"] or [], row["idxs"] or [], row["w_channels"] or [], row["w_types"] or [],
        row["w_blobs"] or [], row["paths"] or [], strict=True,
    )]
    return Stored(
        checkpoint_ns=row["checkpoint_ns"], checkpoint_id=row["checkpoint_id"], parent_id=row["parent_id"],
        type=row["type"], checkpoint=bytes(row["checkpoint"]), metadata=row["metadata"], blobs=blobs, writes=writes,
        generation=row["generation"],
    )


async def one(sql: Sql, tenant_id: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> Stored | None:
    row = await sql.one(_ONE, {
        **key(tenant_id, thread_id), "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id, "limit": 1,
    })
    return None if row is None else _stored(row)


async def page(
    sql: Sql, tenant_id: str, thread_id: str, *, checkpoint_ns: str | None, before: str | None,
    after: tuple[str, str] | None, metadata: dict[str, Any], limit: int,
) -> list[Stored]:
    params = {
        **key(tenant_id, thread_id), "before": before, "after_id": after[0] if after else None, "filter": metadata,
        "limit": limit,
    }
    if checkpoint_ns is not None:
        rows = await sql.all(_PAGE_NS, {**params, "checkpoint_ns": checkpoint_ns})
    else:
        rows = await sql.all(_PAGE_ALL, {**params, "after_ns": after[1] if after else None})
    return [_stored(row) for row in rows]




_STORED_GENERATION = Statement(
    f"SELECT generation FROM thread_checkpoints WHERE {T} AND checkpoint_ns = :checkpoint_ns "
    "AND checkpoint_id = :checkpoint_id"
)


async def stored_generation(
    sql: Sql, tenant_id: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str
) -> int | None:
    """The thread's generation when this checkpoint was stored; None when it is not stored."""
    row = await sql.one(_STORED_GENERATION, {
        **key(tenant_id, thread_id), "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id,
    })
    return None if row is None else int(row["generation"])
