"""Checkpoints, their blobs and their pending writes: stored sealed, and read (opened) one or a page at a time.

What is stored is sealed by `seal_put` / `seal_writes` before the caller's transaction opens (the key provider down:
`Unavailable`, nothing written); what is read is opened here, so services see the saver's bytes only. A put that
replaces a stored checkpoint or special write answers the leaves it replaced, for the caller to shred.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.db.statements import Row, Sql, Statement
from app.keys.content import Sealer
from app.threads.repositories import sealing
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




@dataclass(frozen=True)
class SealedPut:
    """A checkpoint's bytes and metadata under its leaf, and each blob under its own (`blob_leaves`)."""

    leaf: int
    checkpoint: bytes
    metadata: bytes
    run_id: str | None
    blobs: list[Blob]  # data sealed
    blob_leaves: list[int]


@dataclass(frozen=True)
class Outcome:
    stored: bool  # False: the checkpoint or its parent was deleted, nothing stored
    replaced: list[int]  # leaves of the rows this write replaced: to shred once it committed


async def seal_put(
    sealer: Sealer, tenant_id: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str, *, checkpoint: bytes,
    metadata: dict[str, Any], blobs: list[Blob],
) -> SealedPut:
    stream = sealing.stream(thread_id)
    leaf = await sealer.leaf(tenant_id, stream)

    def at(column: str) -> Any:
        return sealing.checkpoint_binding(tenant_id, thread_id, checkpoint_ns, checkpoint_id, column)

    sealed_blobs, leaves = [], []
    for b in blobs:
        blob_leaf = await sealer.leaf(tenant_id, stream)
        binding = sealing.blob_binding(tenant_id, thread_id, checkpoint_ns, b.channel, b.version)
        sealed_blobs.append(Blob(b.channel, b.version, b.type, await sealing.seal(sealer, blob_leaf, binding, b.data)))
        leaves.append(blob_leaf)
    return SealedPut(
        leaf=leaf, checkpoint=await sealing.seal(sealer, leaf, at("checkpoint"), checkpoint),
        metadata=await sealing.seal(sealer, leaf, at("metadata"), sealing.dump_metadata(metadata)),
        run_id=sealing.run_id_of(metadata), blobs=sealed_blobs, blob_leaves=leaves,
    )


async def seal_writes(
    sealer: Sealer, tenant_id: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str, task_id: str,
    writes: list[tuple[int, str, str, bytes]],
) -> list[tuple[int, str, str, bytes, int]]:
    """(idx, channel, type, data) writes as (idx, channel, type, sealed data, leaf), a leaf each."""
    sealed = []
    for idx, channel, type_, data in writes:
        leaf = await sealer.leaf(tenant_id, sealing.stream(thread_id))
        binding = sealing.write_binding(tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
        sealed.append((idx, channel, type_, await sealing.seal(sealer, leaf, binding, data), leaf))
    return sealed


_DEAD = f"""
    dead AS (SELECT 1 FROM thread_deleted_checkpoints
              WHERE {T} AND checkpoint_id = ANY(CAST(:checks AS text[])) LIMIT 1)
"""

# A checkpoint and its new blobs in one statement, unless the checkpoint or its parent was deleted; a put of an id
# already stored replaces it (LangGraph re-puts a checkpoint it updates, as PostgresSaver allows), and the replaced
# row's leaf is answered (`old` reads the statement's snapshot: the row before the update) for the caller to shred.
# New rows hold their metadata sealed only (`metadata` NULL, migration 0020).
_PUT = Statement(
    f"""
    WITH {_DEAD},
    old AS (SELECT leaf FROM thread_checkpoints
             WHERE {T} AND checkpoint_ns = :checkpoint_ns AND checkpoint_id = :checkpoint_id),
    blobs AS (
        INSERT INTO thread_blobs (tenant_id, thread_id, checkpoint_ns, channel, version, type, blob, leaf)
        SELECT :tenant_id, :thread_id, :checkpoint_ns, u.channel, u.version, u.type, u.blob, u.leaf
          FROM unnest(CAST(:channels AS text[]), CAST(:versions AS text[]), CAST(:types AS text[]),
                      CAST(:blobs AS bytea[]), CAST(:leaves AS bigint[])) AS u(channel, version, type, blob, leaf)
         WHERE NOT EXISTS (SELECT 1 FROM dead)
        ON CONFLICT DO NOTHING
    ),
    cp AS (
        INSERT INTO thread_checkpoints
               (tenant_id, thread_id, checkpoint_ns, checkpoint_id, parent_id, type, checkpoint, metadata,
                metadata_sealed, leaf, run_id, versions, generation)
        SELECT :tenant_id, :thread_id, :checkpoint_ns, :checkpoint_id, :parent_id, :type, :checkpoint, NULL,
               :metadata_sealed, :leaf, :run_id, :channel_versions, :generation
         WHERE NOT EXISTS (SELECT 1 FROM dead)
        ON CONFLICT (tenant_id, thread_id, checkpoint_ns, checkpoint_id) DO UPDATE
           SET parent_id = EXCLUDED.parent_id, type = EXCLUDED.type, checkpoint = EXCLUDED.checkpoint,
               metadata = NULL, metadata_sealed = EXCLUDED.metadata_sealed, leaf = EXCLUDED.leaf,
               run_id = EXCLUDED.run_id, versions = EXCLUDED.versions, generation = EXCLUDED.generation
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM cp) AS stored, (SELECT leaf FROM old) AS replaced
    """,
    json=["channel_versions"],
)

# Regular writes (idx >= 0) are kept as first written, special ones (ERROR, INTERRUPT...: idx < 0) replaced, as in
# LangGraph's own savers; the leaves of the replaced ones are answered.
_PUT_WRITES = Statement(
    f"""
    WITH {_DEAD},
    old AS (SELECT leaf FROM thread_writes
             WHERE {T} AND checkpoint_ns = :checkpoint_ns AND checkpoint_id = :checkpoint_id AND task_id = :task_id
               AND idx = ANY(CAST(:idxs AS int[])) AND idx < 0 AND leaf IS NOT NULL),
    ins AS (
        INSERT INTO thread_writes
               (tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob, task_path,
                leaf)
        SELECT :tenant_id, :thread_id, :checkpoint_ns, :checkpoint_id, :task_id, u.idx, u.channel, u.type, u.blob,
               :task_path, u.leaf
          FROM unnest(CAST(:idxs AS int[]), CAST(:channels AS text[]), CAST(:types AS text[]),
                      CAST(:blobs AS bytea[]), CAST(:leaves AS bigint[])) AS u(idx, channel, type, blob, leaf)
         WHERE NOT EXISTS (SELECT 1 FROM dead)
        ON CONFLICT (tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE
           SET channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob, task_path = EXCLUDED.task_path,
               leaf = EXCLUDED.leaf
         WHERE thread_writes.idx < 0
    )
    SELECT NOT EXISTS (SELECT 1 FROM dead) AS stored, ARRAY(SELECT leaf FROM old) AS replaced
    """
)

# A refused put's checkpoint joins the deleted ids, and the writes that reached it first go with it (their leaves
# answered, to shred).
_BURY = Statement(
    f"""
    WITH w AS (DELETE FROM thread_writes WHERE {T} AND checkpoint_id = :checkpoint_id RETURNING leaf),
    d AS (
        INSERT INTO thread_deleted_checkpoints (tenant_id, thread_id, checkpoint_id)
        VALUES (:tenant_id, :thread_id, :checkpoint_id)
        ON CONFLICT DO NOTHING
    )
    SELECT ARRAY(SELECT leaf FROM w WHERE leaf IS NOT NULL) AS leaves
    """
)

# One checkpoint or a page of them, newest first, each with its blobs and its writes in `writes_sort_key` order.
# The page is chosen first (an index scan of the primary key, newest first) and only its rows are filled in: filled
# before the LIMIT, every checkpoint of the thread would be. The metadata filter is applied in the process, on the
# opened metadata (`page`): it is sealed.
_SELECT = """
    WITH page AS (
        SELECT c.* FROM thread_checkpoints c
         WHERE c.tenant_id = :tenant_id AND c.thread_id = :thread_id {where}
         ORDER BY {order}
         LIMIT :limit
    )
    SELECT c.checkpoint_ns, c.checkpoint_id, c.parent_id, c.type, c.checkpoint, c.metadata, c.metadata_sealed, c.leaf,
           (SELECT t.generation FROM threads t WHERE t.tenant_id = c.tenant_id AND t.thread_id = c.thread_id)
               AS generation,
           b.channels, b.versions, b.types, b.blobs, b.leaves,
           w.task_ids, w.idxs, w.channels AS w_channels, w.types AS w_types, w.blobs AS w_blobs, w.paths,
           w.leaves AS w_leaves
      FROM page c
      LEFT JOIN LATERAL (
        SELECT array_agg(tb.channel) AS channels, array_agg(tb.version) AS versions, array_agg(tb.type) AS types,
               array_agg(tb.blob) AS blobs, array_agg(tb.leaf) AS leaves
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
               array_agg(tw.task_path ORDER BY tw.task_path, tw.task_id, tw.idx) AS paths,
               array_agg(tw.leaf ORDER BY tw.task_path, tw.task_id, tw.idx) AS leaves
          FROM thread_writes tw
         WHERE tw.tenant_id = c.tenant_id AND tw.thread_id = c.thread_id AND tw.checkpoint_ns = c.checkpoint_ns
           AND tw.checkpoint_id = c.checkpoint_id
      ) w ON true
     ORDER BY {order}
"""
_BEFORE = """
       AND (CAST(:before AS text) IS NULL OR c.checkpoint_id < CAST(:before AS text))
"""
_ONE = Statement(
    _SELECT.format(where="AND c.checkpoint_ns = :checkpoint_ns AND c.checkpoint_id = :checkpoint_id",
                   order="c.checkpoint_id DESC"),
    json=["metadata"],
)
# One namespace (what LangGraph asks for): a backward scan of the primary key. `after_id` is a page's cursor.
_PAGE_NS = Statement(
    _SELECT.format(where="AND c.checkpoint_ns = :checkpoint_ns" + _BEFORE
                   + "AND (CAST(:after_id AS text) IS NULL OR c.checkpoint_id < CAST(:after_id AS text))",
                   order="c.checkpoint_id DESC"),
    json=["metadata"],
)
# Every namespace, newest first across them; `before` is LangGraph's (every checkpoint older than that id).
_PAGE_ALL = Statement(
    _SELECT.format(where=_BEFORE + """
       AND (CAST(:after_id AS text) IS NULL
            OR (c.checkpoint_id, c.checkpoint_ns) < (CAST(:after_id AS text), CAST(:after_ns AS text)))""",
                   order="c.checkpoint_id DESC, c.checkpoint_ns DESC"),
    json=["metadata"],
)
# With a metadata filter a page scans this many rows at a time (at least), opening and testing each.
FILTERED_SCAN = 50


async def put(
    sql: Sql, tenant_id: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str, parent_id: str | None, *,
    type: str, sealed: SealedPut, channel_versions: dict[str, str], generation: int,
) -> Outcome:
    """Store a sealed checkpoint with its new blobs; not stored when it or its parent was deleted."""
    row = await sql.one(_PUT, {
        **key(tenant_id, thread_id), "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id,
        "parent_id": parent_id, "checks": [checkpoint_id] + ([parent_id] if parent_id else []),
        "type": type, "checkpoint": sealed.checkpoint, "metadata_sealed": sealed.metadata, "leaf": sealed.leaf,
        "run_id": sealed.run_id, "channel_versions": channel_versions, "generation": generation,
        "channels": [b.channel for b in sealed.blobs], "versions": [b.version for b in sealed.blobs],
        "types": [b.type for b in sealed.blobs], "blobs": [b.data for b in sealed.blobs],
        "leaves": sealed.blob_leaves,
    })
    stored = row is not None and row["stored"] == 1
    replaced = row["replaced"] if stored and row is not None else None
    return Outcome(stored, [replaced] if replaced is not None and replaced != sealed.leaf else [])


async def bury(sql: Sql, tenant_id: str, thread_id: str, checkpoint_id: str) -> list[int]:
    """Record a refused checkpoint as deleted and drop its writes; answers their leaves."""
    row = await sql.one(_BURY, {**key(tenant_id, thread_id), "checkpoint_id": checkpoint_id})
    return [] if row is None else list(row["leaves"])


async def put_writes(
    sql: Sql, tenant_id: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str, task_id: str, task_path: str,
    writes: list[tuple[int, str, str, bytes, int]],
) -> Outcome:
    """Store sealed (idx, channel, type, data, leaf) writes; not stored when the checkpoint was deleted."""
    row = await sql.one(_PUT_WRITES, {
        **key(tenant_id, thread_id), "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id,
        "checks": [checkpoint_id], "task_id": task_id, "task_path": task_path,
        "idxs": [w[0] for w in writes], "channels": [w[1] for w in writes], "types": [w[2] for w in writes],
        "blobs": [w[3] for w in writes], "leaves": [w[4] for w in writes],
    })
    stored = row is not None and bool(row["stored"])
    return Outcome(stored, list(row["replaced"]) if stored and row is not None else [])


async def _opened(sealer: Sealer, tenant_id: str, thread_id: str, row: Row) -> Stored | None:
    """A selected checkpoint opened; None when its own leaf was shredded (a punctured blob or write is left out)."""
    ns, checkpoint_id = row["checkpoint_ns"], row["checkpoint_id"]
    checkpoint = await sealing.open_or_none(
        sealer, row["leaf"], sealing.checkpoint_binding(tenant_id, thread_id, ns, checkpoint_id, "checkpoint"),
        row["checkpoint"],
    )
    metadata = await sealing.open_metadata(sealer, tenant_id, thread_id, row)
    if checkpoint is None or metadata is None:
        return None
    blobs = []
    for channel, version, type_, data, leaf in zip(
        row["channels"] or [], row["versions"] or [], row["types"] or [], row["blobs"] or [], row["leaves"] or [],
        strict=True,
    ):
        binding = sealing.blob_binding(tenant_id, thread_id, ns, channel, version)
        if (opened := await sealing.open_or_none(sealer, leaf, binding, data)) is not None:
            blobs.append(Blob(channel, version, type_, opened))
    writes = []
    for task_id, idx, channel, type_, data, path, leaf in zip(
        row["task_ids"] or [], row["idxs"] or [], row["w_channels"] or [], row["w_types"] or [],
        row["w_blobs"] or [], row["paths"] or [], row["w_leaves"] or [], strict=True,
    ):
        binding = sealing.write_binding(tenant_id, thread_id, ns, checkpoint_id, task_id, idx)
        if (opened := await sealing.open_or_none(sealer, leaf, binding, data)) is not None:
            writes.append(Write(task_id, idx, channel, type_, opened, path))
    return Stored(
        checkpoint_ns=ns, checkpoint_id=checkpoint_id, parent_id=row["parent_id"], type=row["type"],
        checkpoint=checkpoint, metadata=metadata, blobs=blobs, writes=writes, generation=row["generation"],
    )


async def one(
    sql: Sql, sealer: Sealer, tenant_id: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str
) -> Stored | None:
    row = await sql.one(_ONE, {
        **key(tenant_id, thread_id), "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id, "limit": 1,
    })
    return None if row is None else await _opened(sealer, tenant_id, thread_id, row)


async def page(
    sql: Sql, sealer: Sealer, tenant_id: str, thread_id: str, *, checkpoint_ns: str | None, before: str | None,
    after: tuple[str, str] | None, metadata: dict[str, Any], limit: int,
) -> list[Stored]:
    """Up to `limit` checkpoints newest first after the cursor `after`, whose metadata holds `metadata` (jsonb
    containment, tested on the opened metadata) and whose leaf is not shredded. Rows are scanned a page at a time
    from the cursor on, so a filter costs the rows it skips, never the whole thread at once."""
    found: list[Stored] = []
    while len(found) < limit:
        want = limit - len(found)
        batch = max(want, FILTERED_SCAN) if metadata else want
        params = {
            **key(tenant_id, thread_id), "before": before, "after_id": after[0] if after else None, "limit": batch,
        }
        if checkpoint_ns is not None:
            rows = await sql.all(_PAGE_NS, {**params, "checkpoint_ns": checkpoint_ns})
        else:
            rows = await sql.all(_PAGE_ALL, {**params, "after_ns": after[1] if after else None})
        for row in rows:
            opened = await _opened(sealer, tenant_id, thread_id, row)
            if opened is not None and sealing.contains(opened.metadata, metadata):
                found.append(opened)
                if len(found) == limit:
                    break
        if len(rows) < batch:
            break
        after = (rows[-1]["checkpoint_id"], rows[-1]["checkpoint_ns"])
    return found


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
