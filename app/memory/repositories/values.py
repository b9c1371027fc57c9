"""A page of a namespace's live records with their values (`GET /v1/memory/{namespace}?values=true`): one statement
per page, each value opened in the process as a read opens it. Tombstones and expired records are never selected; a
record whose leaf a forget shredded (a restored backup) is answered `erased`, without a value, so the caller leaves
it out and its cursor still moves past it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.db.statements import Row, Sql, Statement
from app.keys.content import Sealer
from app.memory.repositories.records import LIVE
from app.memory.repositories.sealing import RECORDS, open_value


@dataclass(frozen=True)
class LiveRecord:
    key: str
    version: int
    value: Any  # None when erased
    erased: bool
    source: str
    updated_at: datetime
    created_at: datetime
    expires_at: datetime | None


# Two statements rather than `(:after IS NULL OR key > :after)`, which would keep the planner off the PK range scan.
_LIVE_RECORDS_SQL = f"""
    SELECT key, version, value, value_sealed, source, updated_at, created_at, expires_at FROM memory_records
     WHERE tenant_id = :tenant_id AND namespace = :namespace AND {LIVE} {{after}}
     ORDER BY key
     LIMIT :limit
"""
_FIRST = Statement(_LIVE_RECORDS_SQL.format(after=""), json=["value"])
_AFTER = Statement(_LIVE_RECORDS_SQL.format(after="AND key > :after"), json=["value"])
_OF_KEYS = Statement(_LIVE_RECORDS_SQL.format(after="AND key = ANY(CAST(:keys AS text[]))"), json=["value"])


async def live_records(
    db: Sql, sealer: Sealer, tenant_id: str, namespace: str, *, after: str | None, limit: int
) -> list[LiveRecord]:
    """Keyset page of the live records, in key order, strictly after `after`, their values opened."""
    params: dict[str, Any] = {"tenant_id": tenant_id, "namespace": namespace, "limit": limit}
    rows = await db.all(_FIRST, params) if after is None else await db.all(_AFTER, {**params, "after": after})
    return await _opened(sealer, tenant_id, namespace, rows)


async def records_of(db: Sql, sealer: Sealer, tenant_id: str, namespace: str, keys: list[str]) -> list[LiveRecord]:
    """The live records among `keys`, in key order, their values opened (a page of the key catalog's)."""
    params = {"tenant_id": tenant_id, "namespace": namespace, "limit": len(keys), "keys": keys}
    return await _opened(sealer, tenant_id, namespace, await db.all(_OF_KEYS, params) if keys else [])


async def _opened(sealer: Sealer, tenant_id: str, namespace: str, rows: Sequence[Row]) -> list[LiveRecord]:
    out = []
    for r in rows:
        opened = await open_value(sealer, tenant_id, RECORDS, namespace, r["key"], r)
        out.append(LiveRecord(
            key=r["key"], version=r["version"], value=opened.value, erased=opened.erased, source=r["source"],
            updated_at=r["updated_at"], created_at=r["created_at"], expires_at=r["expires_at"],
        ))
    return out
