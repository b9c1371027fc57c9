"""Sealing thread data written before migration 0020: checkpoints, channel values and pending writes in the clear.

`lethe keys seal` (app/keys/admin.py) walks each table in primary-key order, a page per transaction, and seals each
row as the live code seals a new one (sealing.py): a fresh leaf of its thread's stream, the bytes sealed in place,
a checkpoint's metadata moved to `metadata_sealed` with its `run_id` copied to the clear column `delete_for_runs`
finds runs by. Rows are locked `FOR UPDATE SKIP LOCKED`: a put, delete or rewrite holding one is never waited for
(the next pass takes it), and one that comes after finds a sealed row, whose leaf it shreds like any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.db.statements import Row, Sql, Statement
from app.keys.content import Sealer
from app.threads.repositories.sealing import (
    BLOBS,
    CHECKPOINTS,
    WRITES,
    blob_binding,
    checkpoint_binding,
    dump_metadata,
    run_id_of,
    stream,
    write_binding,
)

Cursor = tuple[str, tuple[Any, ...]]  # (table, the last primary key after the tenant's columns)

# Each table's primary key, as the keyset cursor pages on it.
_KEYS = {
    CHECKPOINTS: ("tenant_id", "thread_id", "checkpoint_ns", "checkpoint_id"),
    BLOBS: ("tenant_id", "thread_id", "checkpoint_ns", "channel", "version"),
    WRITES: ("tenant_id", "thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx"),
}
_CONTENT = {CHECKPOINTS: "checkpoint, metadata", BLOBS: "blob", WRITES: "blob"}
_ORDER = (CHECKPOINTS, BLOBS, WRITES)


def _page(table: str, first: bool) -> Statement:
    key = _KEYS[table]
    after = "" if first else f"AND ({', '.join(key)}) > ({', '.join(f':k{i}' for i in range(len(key)))})"
    return Statement(
        f"""
        SELECT {', '.join(key)}, {_CONTENT[table]} FROM {table}
         WHERE leaf IS NULL {after}
         ORDER BY {', '.join(key)}
         LIMIT :limit
           FOR UPDATE SKIP LOCKED
        """,
        json=("metadata",),
    )


def _where(table: str) -> str:
    return " AND ".join(f"{column} = :{column}" for column in _KEYS[table]) + " AND leaf IS NULL"


_SEAL = {
    CHECKPOINTS: Statement(
        f"""UPDATE {CHECKPOINTS} SET checkpoint = :sealed, metadata = NULL, metadata_sealed = :metadata_sealed,
                   run_id = :run_id, leaf = :leaf
             WHERE {_where(CHECKPOINTS)}"""
    ),
    BLOBS: Statement(f"UPDATE {BLOBS} SET blob = :sealed, leaf = :leaf WHERE {_where(BLOBS)}"),
    WRITES: Statement(f"UPDATE {WRITES} SET blob = :sealed, leaf = :leaf WHERE {_where(WRITES)}"),
}

_LEFT = Statement(
    f"""SELECT (SELECT count(*) FROM {CHECKPOINTS} WHERE leaf IS NULL)
             + (SELECT count(*) FROM {BLOBS} WHERE leaf IS NULL)
             + (SELECT count(*) FROM {WRITES} WHERE leaf IS NULL) AS rows"""
)


@dataclass(frozen=True)
class Page:
    sealed: int
    after: Cursor | None  # None: the pass is over


FIRST: Cursor = (CHECKPOINTS, ())


async def _seal_row(sql: Sql, sealer: Sealer, table: str, row: Row) -> int:
    tenant_id, thread_id, ns = row["tenant_id"], row["thread_id"], row["checkpoint_ns"]
    leaf = await sealer.leaf(tenant_id, stream(thread_id))
    params: dict[str, Any] = {column: row[column] for column in _KEYS[table]}
    params["leaf"] = leaf
    if table == CHECKPOINTS:
        metadata = dict(row["metadata"] or {})
        binding = checkpoint_binding(tenant_id, thread_id, ns, row["checkpoint_id"], "checkpoint")
        params["sealed"] = await sealer.seal_bytes(leaf, binding, bytes(row["checkpoint"]))
        binding = checkpoint_binding(tenant_id, thread_id, ns, row["checkpoint_id"], "metadata")
        params["metadata_sealed"] = await sealer.seal_bytes(leaf, binding, dump_metadata(metadata))
        params["run_id"] = run_id_of(metadata)
    elif table == BLOBS:
        binding = blob_binding(tenant_id, thread_id, ns, row["channel"], row["version"])
        params["sealed"] = await sealer.seal_bytes(leaf, binding, bytes(row["blob"]))
    else:
        binding = write_binding(tenant_id, thread_id, ns, row["checkpoint_id"], row["task_id"], row["idx"])
        params["sealed"] = await sealer.seal_bytes(leaf, binding, bytes(row["blob"]))
    return await sql.rowcount(_SEAL[table], params)


async def seal_page(sql: Sql, sealer: Sealer, after: Cursor, limit: int) -> Page:
    """Seal up to `limit` clear rows of the cursor's table after its key, in the caller's transaction; at the end
    of a table the cursor moves to the next one."""
    table, last = after
    params: dict[str, Any] = {"limit": limit, **{f"k{i}": value for i, value in enumerate(last)}}
    rows = await sql.all(_page(table, not last), params)
    sealed = 0
    for row in rows:
        sealed += await _seal_row(sql, sealer, table, row)
    if len(rows) < limit:  # this table is done for the pass
        following = _ORDER.index(table) + 1
        return Page(sealed, (_ORDER[following], ()) if following < len(_ORDER) else None)
    return Page(sealed, (table, tuple(rows[-1][column] for column in _KEYS[table])))


async def left(sql: Sql) -> int:
    row = await sql.one(_LEFT, {})
    return int(row["rows"]) if row else 0


TABLES = _ORDER
