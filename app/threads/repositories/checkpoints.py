"""Checkpoints, their blobs and their pending writes: stored sealed (read back, opened, by `reads`).

What is stored is sealed by `seal_put` / `seal_writes` before the caller's transaction opens (the key provider down:
`Unavailable`, nothing written); what is read is opened in `reads`, so services see the saver's bytes only. A put that
replaces a stored checkpoint or special write answers the leaves it replaced, for the caller to shred.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.db.statements import Sql, Statement
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
