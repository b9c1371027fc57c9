"""Deletes (a thread, runs, all but the latest), copies, and the rewrite of a thread's serialized values.

Every function that removes or replaces rows answers their leaves (`DELETE ... RETURNING leaf`, never a decryption):
the caller records them and shreds them once its transaction committed (app/threads/service.py). A copy opens the
source's rows and seals them afresh for the target (a ciphertext is bound to its row), under the target's leaves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.db.statements import Row, Sql, Statement
from app.keys.content import Sealer
from app.threads.repositories import sealing
from app.threads.repositories.locks import T, key


@dataclass(frozen=True)
class Removed:
    checkpoints: int  # checkpoints deleted
    leaves: list[int]  # of every row deleted (checkpoints, writes, blobs no checkpoint uses any more)


NOTHING = Removed(0, [])


# Deletes record the ids they removed (with those of writes whose checkpoint never landed) before anything else can
# take the lock, then drop the blobs no remaining checkpoint uses.
_DELETE = """
    WITH gone AS (
        DELETE FROM thread_checkpoints c
         WHERE c.tenant_id = :tenant_id AND c.thread_id = ANY(CAST(:thread_ids AS text[]))
        {which}
        RETURNING c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.leaf
    ),
    writes AS (
        DELETE FROM thread_writes w
         WHERE w.tenant_id = :tenant_id AND w.thread_id = ANY(CAST(:thread_ids AS text[])) {which_writes}
        RETURNING w.thread_id, w.checkpoint_id, w.leaf
    ),
    dead AS (
        INSERT INTO thread_deleted_checkpoints (tenant_id, thread_id, checkpoint_id)
        SELECT :tenant_id, thread_id, checkpoint_id FROM gone
         UNION SELECT :tenant_id, thread_id, checkpoint_id FROM writes
        ON CONFLICT DO NOTHING
    )
    SELECT (SELECT count(*) FROM gone) AS deleted,
           ARRAY(SELECT leaf FROM gone WHERE leaf IS NOT NULL
                 UNION ALL SELECT leaf FROM writes WHERE leaf IS NOT NULL) AS leaves
"""
# A run's checkpoints: by the clear `run_id` (migration 0020), or by the metadata of rows from before it.
_OF_RUNS = """(c.run_id = ANY(CAST(:run_ids AS text[])) OR c.metadata ->> 'run_id' = ANY(CAST(:run_ids AS text[])))"""
_DELETE_ALL = Statement(_DELETE.format(which="", which_writes=""))
_DELETE_RUNS = Statement(_DELETE.format(
    which="AND " + _OF_RUNS,
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
    RETURNING b.leaf
    """
)
_RUN_THREADS = Statement(
    f"""
    SELECT DISTINCT c.thread_id FROM thread_checkpoints c
     WHERE c.tenant_id = :tenant_id AND {_OF_RUNS}
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
# A copy reads the source's rows, opens them and inserts them sealed for the target (`copy`).
_SOURCE_CHECKPOINTS = Statement(
    f"""
    SELECT checkpoint_ns, checkpoint_id, parent_id, type, checkpoint, metadata, metadata_sealed, leaf, run_id,
           versions
      FROM thread_checkpoints WHERE {T} ORDER BY checkpoint_ns, checkpoint_id
    """,
    json=["metadata", "versions"],
)
_COPY = Statement(
    """
    WITH target AS (
        SELECT t.tenant_id, t.thread_id, t.generation FROM threads t
         WHERE t.tenant_id = CAST(:tenant_id AS varchar) AND t.thread_id = CAST(:target_id AS varchar)
    ),
    cps AS (
        INSERT INTO thread_checkpoints
               (tenant_id, thread_id, checkpoint_ns, checkpoint_id, parent_id, type, checkpoint, metadata,
                metadata_sealed, leaf, run_id, versions, generation)
        SELECT t.tenant_id, t.thread_id, u.ns, u.checkpoint_id, u.parent_id, u.type, u.checkpoint, NULL,
               u.metadata_sealed, u.leaf, u.run_id, CAST(u.versions AS jsonb), t.generation
          FROM target t,
               unnest(CAST(:c_nss AS text[]), CAST(:c_ids AS text[]), CAST(:c_parents AS text[]),
                      CAST(:c_types AS text[]), CAST(:c_checkpoints AS bytea[]), CAST(:c_metadata AS bytea[]),
                      CAST(:c_leaves AS bigint[]), CAST(:c_runs AS text[]), CAST(:c_versions AS text[]))
               AS u(ns, checkpoint_id, parent_id, type, checkpoint, metadata_sealed, leaf, run_id, versions)
        ON CONFLICT DO NOTHING
        RETURNING 1
    ),
    blobs AS (
        INSERT INTO thread_blobs (tenant_id, thread_id, checkpoint_ns, channel, version, type, blob, leaf)
        SELECT t.tenant_id, t.thread_id, u.ns, u.channel, u.version, u.type, u.blob, u.leaf
          FROM target t,
               unnest(CAST(:b_nss AS text[]), CAST(:b_channels AS text[]), CAST(:b_versions AS text[]),
                      CAST(:b_types AS text[]), CAST(:b_blobs AS bytea[]), CAST(:b_leaves AS bigint[]))
               AS u(ns, channel, version, type, blob, leaf)
        ON CONFLICT DO NOTHING
    ),
    writes AS (
        INSERT INTO thread_writes
               (tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob, task_path,
                leaf)
        SELECT t.tenant_id, t.thread_id, u.ns, u.checkpoint_id, u.task_id, u.idx, u.channel, u.type, u.blob,
               u.task_path, u.leaf
          FROM target t,
               unnest(CAST(:w_nss AS text[]), CAST(:w_ids AS text[]), CAST(:w_tasks AS text[]),
                      CAST(:w_idxs AS int[]), CAST(:w_channels AS text[]), CAST(:w_types AS text[]),
                      CAST(:w_blobs AS bytea[]), CAST(:w_paths AS text[]), CAST(:w_leaves AS bigint[]))
               AS u(ns, checkpoint_id, task_id, idx, channel, type, blob, task_path, leaf)
        ON CONFLICT DO NOTHING
    )
    SELECT count(*) AS copied FROM cps
    """
)

_ALL_BLOBS = Statement(
    f"SELECT checkpoint_ns, channel, version, type, blob, leaf FROM thread_blobs WHERE {T} "
    "ORDER BY checkpoint_ns, channel, version"
)
_ALL_WRITES = Statement(
    f"SELECT checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob, task_path, leaf FROM thread_writes "
    f"WHERE {T} ORDER BY checkpoint_ns, checkpoint_id, task_path, task_id, idx"
)
# A rewrite's rows get new ciphertexts under fresh leaves; `o` is the row as the statement's snapshot saw it (before
# the update: the thread is locked), so RETURNING answers the replaced leaf.
_REPLACE_BLOBS = Statement(
    """
    UPDATE thread_blobs b SET type = u.type, blob = u.blob, leaf = u.leaf
      FROM unnest(CAST(:nss AS text[]), CAST(:channels AS text[]), CAST(:versions AS text[]),
                  CAST(:types AS text[]), CAST(:blobs AS bytea[]), CAST(:leaves AS bigint[]))
           AS u(ns, channel, version, type, blob, leaf),
           thread_blobs o
     WHERE b.tenant_id = :tenant_id AND b.thread_id = :thread_id AND b.checkpoint_ns = u.ns AND b.channel = u.channel
       AND b.version = u.version
       AND o.tenant_id = b.tenant_id AND o.thread_id = b.thread_id AND o.checkpoint_ns = b.checkpoint_ns
       AND o.channel = b.channel AND o.version = b.version
    RETURNING o.leaf
    """
)
_REPLACE_WRITES = Statement(
    """
    UPDATE thread_writes w SET type = u.type, blob = u.blob, leaf = u.leaf
      FROM unnest(CAST(:nss AS text[]), CAST(:checkpoint_ids AS text[]), CAST(:task_ids AS text[]),
                  CAST(:idxs AS int[]), CAST(:types AS text[]), CAST(:blobs AS bytea[]), CAST(:leaves AS bigint[]))
           AS u(ns, checkpoint_id, task_id, idx, type, blob, leaf),
           thread_writes o
     WHERE w.tenant_id = :tenant_id AND w.thread_id = :thread_id AND w.checkpoint_ns = u.ns
       AND w.checkpoint_id = u.checkpoint_id
       AND w.task_id = u.task_id AND w.idx = u.idx
       AND o.tenant_id = w.tenant_id AND o.thread_id = w.thread_id AND o.checkpoint_ns = w.checkpoint_ns
       AND o.checkpoint_id = w.checkpoint_id AND o.task_id = w.task_id AND o.idx = w.idx
    RETURNING o.leaf
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
    RETURNING w.leaf
    """
)
_NEXT_GENERATION = Statement(f"UPDATE threads SET generation = generation + 1 WHERE {T} RETURNING generation")



def _leaves(rows: list[Row]) -> list[int]:
    return [row["leaf"] for row in rows if row["leaf"] is not None]


async def _removed(sql: Sql, statement: Statement, params: dict[str, Any]) -> Removed:
    row = await sql.one(statement, params)
    unused = await sql.all(_UNUSED_BLOBS, {"tenant_id": params["tenant_id"], "thread_ids": params["thread_ids"]})
    deleted, leaves = (0, []) if row is None else (int(row["deleted"]), list(row["leaves"]))
    return Removed(deleted, leaves + _leaves(unused))


async def delete(sql: Sql, tenant_id: str, thread_ids: list[str]) -> Removed:
    """Every checkpoint, blob and write of these (locked) threads."""
    return await _removed(sql, _DELETE_ALL, {"tenant_id": tenant_id, "thread_ids": thread_ids})


async def threads_of_runs(sql: Sql, tenant_id: str, run_ids: list[str]) -> list[str]:
    rows = await sql.all(_RUN_THREADS, {"tenant_id": tenant_id, "run_ids": run_ids})
    return [row["thread_id"] for row in rows]


async def delete_runs(sql: Sql, tenant_id: str, thread_ids: list[str], run_ids: list[str]) -> Removed:
    return await _removed(sql, _DELETE_RUNS, {"tenant_id": tenant_id, "thread_ids": thread_ids, "run_ids": run_ids})


async def delete_all_but_latest(sql: Sql, tenant_id: str, thread_ids: list[str]) -> Removed:
    return await _removed(sql, _DELETE_BUT_LATEST, {"tenant_id": tenant_id, "thread_ids": thread_ids})


async def has_checkpoints(sql: Sql, tenant_id: str, thread_id: str) -> bool:
    row = await sql.one(_HAS_CHECKPOINTS, key(tenant_id, thread_id))
    return row is not None and bool(row["has"])


async def copy(sql: Sql, sealer: Sealer, tenant_id: str, thread_id: str, target_id: str) -> int | None:
    """Copy every checkpoint, blob and write to `target_id`, sealed afresh for it under the target's leaves (a row
    whose leaf was shredded is not copied: it reads as absent); None (nothing copied) when one of the checkpoints
    was deleted from the target before."""
    params = {**key(tenant_id, thread_id), "target_id": target_id}
    dead = await sql.one(_DEAD_AMONG_SOURCE, params)
    if dead is not None and dead["dead"]:
        return None
    stream = sealing.stream(target_id)
    columns: dict[str, list[Any]] = {name: [] for name in (
        "c_nss", "c_ids", "c_parents", "c_types", "c_checkpoints", "c_metadata", "c_leaves", "c_runs", "c_versions",
        "b_nss", "b_channels", "b_versions", "b_types", "b_blobs", "b_leaves",
        "w_nss", "w_ids", "w_tasks", "w_idxs", "w_channels", "w_types", "w_blobs", "w_paths", "w_leaves",
    )}

    def add(prefix: str, **values: Any) -> None:
        for name, value in values.items():
            columns[f"{prefix}_{name}"].append(value)

    for c in await sql.all(_SOURCE_CHECKPOINTS, key(tenant_id, thread_id)):
        ns, cid = c["checkpoint_ns"], c["checkpoint_id"]
        data = await sealing.open_or_none(
            sealer, c["leaf"], sealing.checkpoint_binding(tenant_id, thread_id, ns, cid, "checkpoint"), c["checkpoint"]
        )
        metadata = await sealing.open_metadata(sealer, tenant_id, thread_id, c)
        if data is None or metadata is None:
            continue
        leaf = await sealer.leaf(tenant_id, stream)
        at = sealing.checkpoint_binding
        add("c", nss=ns, ids=cid, parents=c["parent_id"], types=c["type"],
            checkpoints=await sealing.seal(sealer, leaf, at(tenant_id, target_id, ns, cid, "checkpoint"), data),
            metadata=await sealing.seal(sealer, leaf, at(tenant_id, target_id, ns, cid, "metadata"),
                                        sealing.dump_metadata(metadata)),
            leaves=leaf, runs=sealing.run_id_of(metadata), versions=sealing.dump_versions(c["versions"]))
    for b in await all_blobs(sql, sealer, tenant_id, thread_id):
        leaf = await sealer.leaf(tenant_id, stream)
        binding = sealing.blob_binding(tenant_id, target_id, b["checkpoint_ns"], b["channel"], b["version"])
        add("b", nss=b["checkpoint_ns"], channels=b["channel"], versions=b["version"], types=b["type"],
            blobs=await sealing.seal(sealer, leaf, binding, b["blob"]), leaves=leaf)
    for w in await all_writes(sql, sealer, tenant_id, thread_id):
        leaf = await sealer.leaf(tenant_id, stream)
        binding = sealing.write_binding(tenant_id, target_id, w["checkpoint_ns"], w["checkpoint_id"], w["task_id"],
                                        w["idx"])
        add("w", nss=w["checkpoint_ns"], ids=w["checkpoint_id"], tasks=w["task_id"], idxs=w["idx"],
            channels=w["channel"], types=w["type"], blobs=await sealing.seal(sealer, leaf, binding, w["blob"]),
            paths=w["task_path"], leaves=leaf)
    # Leaves drawn for rows the target already held (ON CONFLICT DO NOTHING) seal nothing stored: never shredded,
    # never reused.
    row = await sql.one(_COPY, {"tenant_id": tenant_id, "target_id": target_id, **columns})
    return 0 if row is None else int(row["copied"])


async def all_blobs(sql: Sql, sealer: Sealer, tenant_id: str, thread_id: str) -> list[dict[str, Any]]:
    """Every blob of the thread, opened (`blob`: the saver's bytes); one whose leaf was shredded is left out."""
    opened = []
    for row in await sql.all(_ALL_BLOBS, key(tenant_id, thread_id)):
        binding = sealing.blob_binding(tenant_id, thread_id, row["checkpoint_ns"], row["channel"], row["version"])
        data = await sealing.open_or_none(sealer, row["leaf"], binding, row["blob"])
        if data is not None:
            opened.append({**dict(row), "blob": data})
    return opened


async def all_writes(sql: Sql, sealer: Sealer, tenant_id: str, thread_id: str) -> list[dict[str, Any]]:
    """Every pending write of the thread, opened as `all_blobs`."""
    opened = []
    for row in await sql.all(_ALL_WRITES, key(tenant_id, thread_id)):
        binding = sealing.write_binding(tenant_id, thread_id, row["checkpoint_ns"], row["checkpoint_id"],
                                        row["task_id"], row["idx"])
        data = await sealing.open_or_none(sealer, row["leaf"], binding, row["blob"])
        if data is not None:
            opened.append({**dict(row), "blob": data})
    return opened


Replacement = tuple[Any, ...]


async def seal_rewrite(
    sealer: Sealer, tenant_id: str, thread_id: str, *, blobs: list[tuple[str, str, str, str, bytes]],
    writes: list[tuple[str, str, str, int, str, bytes]],
) -> tuple[list[Replacement], list[Replacement]]:
    """A rewrite's blobs (ns, channel, version, type, data) and writes (ns, checkpoint, task, idx, type, data) sealed
    under fresh leaves, each tuple extended with its leaf: before the transaction, so the provider down writes
    nothing."""
    stream = sealing.stream(thread_id)
    sealed_blobs: list[Replacement] = []
    for ns, channel, version, type_, data in blobs:
        leaf = await sealer.leaf(tenant_id, stream)
        binding = sealing.blob_binding(tenant_id, thread_id, ns, channel, version)
        sealed_blobs.append((ns, channel, version, type_, await sealing.seal(sealer, leaf, binding, data), leaf))
    sealed_writes: list[Replacement] = []
    for ns, checkpoint_id, task_id, idx, type_, data in writes:
        leaf = await sealer.leaf(tenant_id, stream)
        binding = sealing.write_binding(tenant_id, thread_id, ns, checkpoint_id, task_id, idx)
        sealed_writes.append(
            (ns, checkpoint_id, task_id, idx, type_, await sealing.seal(sealer, leaf, binding, data), leaf)
        )
    return sealed_blobs, sealed_writes


async def replace(
    sql: Sql, tenant_id: str, thread_id: str, *, blobs: list[Replacement], writes: list[Replacement],
    dropped: list[tuple[str, str, str, int]],
) -> tuple[int, list[int]]:
    """Replace sealed blobs and writes (`seal_rewrite`), drop writes (ns, checkpoint, task, idx); answers the
    thread's new generation and the leaves of every row replaced or dropped."""
    thread = key(tenant_id, thread_id)
    retired: list[int] = []
    if blobs:
        retired += _leaves(await sql.all(_REPLACE_BLOBS, {
            **thread, **_columns(blobs, ["nss", "channels", "versions", "types", "blobs", "leaves"]),
        }))
    if writes:
        retired += _leaves(await sql.all(_REPLACE_WRITES, {
            **thread, **_columns(writes, ["nss", "checkpoint_ids", "task_ids", "idxs", "types", "blobs", "leaves"]),
        }))
    if dropped:
        retired += _leaves(await sql.all(_DROP_WRITES, {
            **thread, **_columns(dropped, ["nss", "checkpoint_ids", "task_ids", "idxs"]),
        }))
    row = await sql.one(_NEXT_GENERATION, thread)
    assert row is not None  # the caller holds the thread's lock
    return int(row["generation"]), retired


def _columns(rows: list[Any], names: list[str]) -> dict[str, list[Any]]:
    return {name: [r[i] for r in rows] for i, name in enumerate(names)}
