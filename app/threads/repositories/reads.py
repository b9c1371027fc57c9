"""Checkpoints read back: one, or a page of one thread's or of every thread of the tenant, newest first, each opened
(its checkpoint, metadata, blobs and writes) in the process; a row whose own leaf was shredded is left out, a
punctured blob or write too. Stored by app/threads/repositories/checkpoints.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from app.db.statements import Row, Sql, Statement
from app.keys.content import Sealer
from app.threads.repositories import sealing
from app.threads.repositories.checkpoints import Blob, Stored, Write
from app.threads.repositories.locks import key

# One checkpoint or a page of them, newest first, each with its blobs and its writes in `writes_sort_key` order.
# The page is chosen first (an index scan of the primary key, newest first) and only its rows are filled in: filled
# before the LIMIT, every checkpoint of the thread would be. Each of a checkpoint's channel versions is one probe of
# thread_blobs' primary key: the `LIMIT 1` (the key is unique) keeps the planner from joining the versions to every
# blob of the namespace (a hash join over the thread's whole history, what it chose from jsonb_each_text's estimate
# of 100 rows). The metadata filter is applied in the process, on the opened metadata (`page`): it is sealed.
_SELECT = """
    WITH page AS (
        SELECT c.* FROM thread_checkpoints c
         WHERE c.tenant_id = :tenant_id {where}
         ORDER BY {order}
         LIMIT :limit
    )
    SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.parent_id, c.type, c.checkpoint, c.metadata,
           c.metadata_sealed, c.leaf,
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
          CROSS JOIN LATERAL (
            SELECT tb.channel, tb.version, tb.type, tb.blob, tb.leaf FROM thread_blobs tb
             WHERE tb.tenant_id = c.tenant_id AND tb.thread_id = c.thread_id AND tb.checkpoint_ns = c.checkpoint_ns
               AND tb.channel = v.key AND tb.version = v.value
             LIMIT 1
          ) tb
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
_THREAD = "AND c.thread_id = :thread_id "
# A bound is written only when it is given (one statement per combination, no `:x IS NULL OR`), so that it is an
# index condition in the generic plan of a prepared statement too (asyncpg prepares every statement): a page of one
# namespace is then a backward scan of the primary key from its cursor, stopped at the LIMIT, however long the
# thread's history (a bound as a filter made every page, and every batch of a filtered page, scan from the newest).
_ID_BEFORE = "AND c.checkpoint_id < CAST(:before AS text)\n"
_ID_AFTER = "AND c.checkpoint_id < CAST(:after_id AS text)\n"
_ONE = Statement(
    _SELECT.format(where=_THREAD + "AND c.checkpoint_ns = :checkpoint_ns AND c.checkpoint_id = :checkpoint_id",
                   order="c.checkpoint_id DESC"),
    json=["metadata"],
)
# One namespace (what LangGraph asks for): a backward scan of the primary key. `after_id` is a page's cursor.
_PAGE_NS = {
    (before, after): Statement(
        _SELECT.format(
            where=_THREAD + "AND c.checkpoint_ns = :checkpoint_ns\n" + (_ID_BEFORE if before else "")
            + (_ID_AFTER if after else ""),
            order="c.checkpoint_id DESC",
        ),
        json=["metadata"],
    )
    for before in (False, True) for after in (False, True)
}
# Every namespace, newest first across them; `before` is LangGraph's (every checkpoint older than that id). The
# primary key orders a thread's rows by namespace first, so this page sorts the thread's rows older than its bounds
# (one namespace is what LangGraph's own calls ask for).
_PAGE_ALL = Statement(
    _SELECT.format(where=_THREAD + _BEFORE + """
       AND (CAST(:after_id AS text) IS NULL
            OR (c.checkpoint_id, c.checkpoint_ns) < (CAST(:after_id AS text), CAST(:after_ns AS text)))""",
                   order="c.checkpoint_id DESC, c.checkpoint_ns DESC"),
    json=["metadata"],
)
# Every thread of the tenant (LangGraph's `list(None)`), newest first across them, ties in (thread, namespace)
# order, descending; `checkpoint_ns` (optional) narrows it to one namespace. Served by the index
# `ix_thread_checkpoints_listing` (tenant, id, thread, namespace; migration 0027): a page is a backward scan of the
# tenant's entries from its cursor, stopped at the LIMIT, never a sort of the tenant's rows. So that `before` and the
# cursor are index conditions in the generic plan of a prepared statement too (asyncpg prepares every statement), a
# bound is written only when it is given: one statement per combination (`tenant_listing`), no `:x IS NULL OR`.
_NS_FILTER = "AND (CAST(:checkpoint_ns AS text) IS NULL OR c.checkpoint_ns = CAST(:checkpoint_ns AS text))\n"
_TENANT_BEFORE = "AND c.checkpoint_id < CAST(:before AS text)\n"
_TENANT_AFTER = """AND (c.checkpoint_id, c.thread_id, c.checkpoint_ns)
           < (CAST(:after_id AS text), CAST(:after_thread AS text), CAST(:after_ns AS text))\n"""
_TENANT_ORDER = "c.checkpoint_id DESC, c.thread_id DESC, c.checkpoint_ns DESC"
_PAGE_TENANT = {
    (before, after): Statement(
        _SELECT.format(
            where=_NS_FILTER + (_TENANT_BEFORE if before else "") + (_TENANT_AFTER if after else ""),
            order=_TENANT_ORDER,
        ),
        json=["metadata"],
    )
    for before in (False, True) for after in (False, True)
}


def tenant_listing(
    tenant_id: str, *, checkpoint_ns: str | None, before: str | None, after: Row | None, limit: int,
) -> tuple[Statement, dict[str, Any]]:
    """The statement and parameters of one batch of `tenant_page`: `after` is the last row seen (its
    checkpoint_id, thread_id and checkpoint_ns), None for the first."""
    params: dict[str, Any] = {"tenant_id": tenant_id, "checkpoint_ns": checkpoint_ns, "limit": limit}
    if before is not None:
        params["before"] = before
    if after is not None:
        params |= {"after_id": after["checkpoint_id"], "after_thread": after["thread_id"],
                   "after_ns": after["checkpoint_ns"]}
    return _PAGE_TENANT[before is not None, after is not None], params


def namespace_listing(
    tenant_id: str, thread_id: str, checkpoint_ns: str, *, before: str | None, after: Row | None, limit: int,
) -> tuple[Statement, dict[str, Any]]:
    """The statement and parameters of one batch of `page` in one namespace: `after` is the last row seen (its
    checkpoint_id), None for the first."""
    params: dict[str, Any] = {**key(tenant_id, thread_id), "checkpoint_ns": checkpoint_ns, "limit": limit}
    if before is not None:
        params["before"] = before
    if after is not None:
        params["after_id"] = after["checkpoint_id"]
    return _PAGE_NS[before is not None, after is not None], params


# With a metadata filter a page scans this many rows at a time (at least), opening and testing each.
FILTERED_SCAN = 50


async def _opened(sealer: Sealer, tenant_id: str, thread_id: str, row: Row, *, fill: bool = True) -> Stored | None:
    """A selected checkpoint opened; None when its own leaf was shredded (a punctured blob or write is left out).
    `fill=False`: its checkpoint and metadata only (whether it is there, and what the filter tests), no blobs or
    writes opened."""
    ns, checkpoint_id = row["checkpoint_ns"], row["checkpoint_id"]
    checkpoint = await sealing.open_or_none(
        sealer, row["leaf"], sealing.checkpoint_binding(tenant_id, thread_id, ns, checkpoint_id, "checkpoint"),
        row["checkpoint"],
    )
    metadata = await sealing.open_metadata(sealer, tenant_id, thread_id, row)
    if checkpoint is None or metadata is None:
        return None
    blobs: list[Blob] = []
    writes: list[Write] = []
    if fill:
        blobs, writes = await _values(sealer, tenant_id, thread_id, row)
    return Stored(
        checkpoint_ns=ns, checkpoint_id=checkpoint_id, parent_id=row["parent_id"], type=row["type"],
        checkpoint=checkpoint, metadata=metadata, blobs=blobs, writes=writes, generation=row["generation"],
    )


async def _values(sealer: Sealer, tenant_id: str, thread_id: str, row: Row) -> tuple[list[Blob], list[Write]]:
    """A selected checkpoint's blobs and writes, opened (a punctured one left out)."""
    ns, checkpoint_id = row["checkpoint_ns"], row["checkpoint_id"]
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
    return blobs, writes


async def one(
    sql: Sql, sealer: Sealer, tenant_id: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str
) -> Stored | None:
    row = await sql.one(_ONE, {
        **key(tenant_id, thread_id), "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id, "limit": 1,
    })
    return None if row is None else await _opened(sealer, tenant_id, thread_id, row)


async def page(
    sql: Sql, sealer: Sealer, tenant_id: str, thread_id: str, *, checkpoint_ns: str | None, before: str | None,
    after: tuple[str, str] | None, metadata: dict[str, Any], limit: int, fill: int | None = None,
) -> list[Stored]:
    """Up to `limit` checkpoints newest first after the cursor `after`, whose metadata holds `metadata` (jsonb
    containment, tested on the opened metadata) and whose leaf is not shredded. Rows are scanned a page at a time
    from the cursor on, so a filter costs the rows it skips, never the whole thread at once. Only the first `fill`
    (default: all) come with their blobs and writes: a row read to learn whether another page follows needs none."""

    async def rows(batch: int, after: Row | None) -> list[Row]:
        if checkpoint_ns is not None:
            return await sql.all(*namespace_listing(tenant_id, thread_id, checkpoint_ns, before=before, after=after,
                                                    limit=batch))
        params = {
            **key(tenant_id, thread_id), "before": before, "limit": batch,
            "after_id": after["checkpoint_id"] if after else None,
            "after_ns": after["checkpoint_ns"] if after else None,
        }
        return await sql.all(_PAGE_ALL, params)

    start = None if after is None else {"checkpoint_id": after[0], "checkpoint_ns": after[1]}
    return [stored for _, stored in await _scan(sealer, tenant_id, rows, start, metadata, limit, fill)]


async def tenant_page(
    sql: Sql, sealer: Sealer, tenant_id: str, *, checkpoint_ns: str | None, before: str | None,
    after: tuple[str, str, str] | None, metadata: dict[str, Any], limit: int, fill: int | None = None,
) -> list[tuple[str, Stored]]:
    """`page` across every thread of the tenant: (thread_id, checkpoint) pairs newest first, after the cursor
    `after` = (checkpoint_id, thread_id, checkpoint_ns)."""

    async def rows(batch: int, after: Row | None) -> list[Row]:
        return await sql.all(*tenant_listing(tenant_id, checkpoint_ns=checkpoint_ns, before=before, after=after,
                                             limit=batch))

    start = None if after is None else {"checkpoint_id": after[0], "thread_id": after[1], "checkpoint_ns": after[2]}
    return await _scan(sealer, tenant_id, rows, start, metadata, limit, fill)


async def _scan(
    sealer: Sealer, tenant_id: str, fetch: Callable[[int, Row | None], Awaitable[list[Row]]], after: Row | None,
    metadata: dict[str, Any], limit: int, fill: int | None,
) -> list[tuple[str, Stored]]:
    """Fetch rows a batch at a time from the cursor `after` (the last row seen), open each and keep those whose
    metadata holds `metadata`, until `limit` are kept or the rows run out; blobs and writes are opened for the first
    `fill` kept (None: all)."""
    found: list[tuple[str, Stored]] = []
    while len(found) < limit:
        want = limit - len(found)
        batch = max(want, FILTERED_SCAN) if metadata else want
        rows = await fetch(batch, after)
        for row in rows:
            opened = await _opened(sealer, tenant_id, row["thread_id"], row, fill=False)
            if opened is not None and sealing.contains(opened.metadata, metadata):
                if fill is None or len(found) < fill:
                    blobs, writes = await _values(sealer, tenant_id, row["thread_id"], row)
                    opened = replace(opened, blobs=blobs, writes=writes)
                found.append((row["thread_id"], opened))
                if len(found) == limit:
                    break
        if len(rows) < batch:
            break
        after = rows[-1]
    return found
