"""SQL for searching memory and for expiring it: the tenant's records under a namespace prefix (ranked in the
process by app/memory/search.py), the time-to-live refresh a read asks for, and the records whose time ran out.

Expiry is judged by the database's clock (`clock_timestamp()`), never a client's or a worker's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.db.statements import Sql, Statement
from app.keys.content import Sealer
from app.memory.repositories.records import EXPIRED
from app.memory.repositories.sealing import RECORDS, open_kept


@dataclass(slots=True)  # not frozen: a search builds one per record under the prefix, and frozen fields cost 3x
class Found:
    namespace: str
    key: str
    version: int
    value: Any
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None
    expired: bool
    leaf: int | None  # what it is sealed under (None: a legacy plaintext row); what is derived from it is kept by it


# Every non-tombstone record in the namespace `:prefix` and those below it (`:below` is prefix + '.'); expired ones
# too, flagged, so the caller tombstones them. An empty prefix is the whole tenant (the primary key's leading column).
# Under a prefix, the byte-wise range [prefix, prefix + '/') holds the prefix and every name below it ('/' follows
# '.' and no name holds it) and is what `ix_memory_records_live_namespaces` (migration 0028, text_pattern_ops: byte
# order whatever the database's collation) scans; the exact test keeps names like prefix + '-x' out of it.
_UNDER_SQL = f"""
    SELECT namespace, key, version, value, value_sealed, created_at, updated_at, expires_at, {EXPIRED} AS expired
      FROM memory_records
     WHERE tenant_id = :tenant_id AND NOT forgotten {{scope}}
     ORDER BY updated_at DESC, namespace, key
"""
_UNDER_ALL = Statement(_UNDER_SQL.format(scope=""), json=["value"])
_UNDER = Statement(_UNDER_SQL.format(scope="""
       AND namespace ~>=~ :prefix AND namespace ~<~ :past
       AND (namespace = :prefix OR starts_with(namespace, :below))"""), json=["value"])

# A read that refreshes: live records with a time to live get it restarted (an expired one is not revived). The rows
# are locked in key order first: two searches refreshing overlapping records in the join's order deadlocked (500s
# under LangGraph's conformance batches).
_REFRESH = Statement(
    """
    WITH wanted AS (
        SELECT m.namespace, m.key FROM memory_records AS m
          JOIN unnest(CAST(:namespaces AS text[]), CAST(:keys AS text[])) AS t(namespace, key)
            ON m.namespace = t.namespace AND m.key = t.key
         WHERE m.tenant_id = :tenant_id AND m.ttl_s IS NOT NULL AND NOT m.forgotten
           AND NOT (m.expires_at <= clock_timestamp())
         ORDER BY m.namespace, m.key
           FOR UPDATE OF m
    )
    UPDATE memory_records AS m SET expires_at = clock_timestamp() + make_interval(secs => m.ttl_s)
      FROM wanted
     WHERE m.tenant_id = :tenant_id AND m.namespace = wanted.namespace AND m.key = wanted.key
    RETURNING m.namespace, m.key, m.expires_at
    """
)

_DUE = Statement(
    f"""
    SELECT tenant_id, namespace, key FROM memory_records
     WHERE expires_at IS NOT NULL AND NOT forgotten AND {EXPIRED}
     ORDER BY expires_at
     LIMIT :limit
    """
)


def under_statement(tenant_id: str, prefix: str) -> tuple[Statement, dict[str, Any]]:
    """The statement `under_prefix` sends, with its parameters (tests read its plan)."""
    if not prefix:
        return _UNDER_ALL, {"tenant_id": tenant_id}
    return _UNDER, {"tenant_id": tenant_id, "prefix": prefix, "past": prefix + "/", "below": prefix + "."}


async def under_prefix(db: Sql, sealer: Sealer, tenant_id: str, prefix: str) -> list[Found]:
    """The tenant's non-tombstone records in `prefix` and below it, newest write first, opened (or recalled: the
    values are shared, never mutate them); those whose leaf was shredded are left out."""
    rows = await db.all(*under_statement(tenant_id, prefix))
    found = []
    for r in rows:
        opened, leaf = await open_kept(sealer, tenant_id, RECORDS, r["namespace"], r["key"], r)
        if not opened.erased:
            found.append(Found(
                r["namespace"], r["key"], r["version"], opened.value, r["created_at"], r["updated_at"],
                r["expires_at"], r["expired"], leaf,
            ))
    return found


async def refresh(db: Sql, tenant_id: str, records: list[tuple[str, str]]) -> dict[tuple[str, str], datetime]:
    """Restart the time to live of these live records; their new expiry, by (namespace, key)."""
    params = {"tenant_id": tenant_id, "namespaces": [n for n, _ in records], "keys": [k for _, k in records]}
    return {(r["namespace"], r["key"]): r["expires_at"] for r in await db.all(_REFRESH, params)}


async def due(db: Sql, *, limit: int) -> list[tuple[str, str, str]]:
    """Records of any tenant whose time to live ran out and that are not tombstoned yet, oldest expiry first."""
    return [(r["tenant_id"], r["namespace"], r["key"]) for r in await db.all(_DUE, {"limit": limit})]
