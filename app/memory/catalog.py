"""What a tenant's memory holds, for the operator: namespaces with their key counts, and keys with tombstones.

Names only, never values: a forgotten key's name stays visible (its history already shows it), its value does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.consistency import PRIMARY, ReadFrom
from app.db.database import Database
from app.memory.validation import check_namespace, decode_cursor, encode_cursor


@dataclass(frozen=True)
class NamespaceRow:
    namespace: str
    live_keys: int
    forgotten_keys: int
    updated_at: datetime


@dataclass(frozen=True)
class KeyRow:
    key: str
    forgotten: bool


# Two statements rather than `(:after IS NULL OR ...)`, which would keep the planner off the primary-key range scan.
_NAMESPACES_SQL = """
    SELECT namespace,
           count(*) FILTER (WHERE NOT forgotten) AS live_keys,
           count(*) FILTER (WHERE forgotten) AS forgotten_keys,
           max(updated_at) AS updated_at
      FROM memory_records
     WHERE tenant_id = :tenant_id {after}
     GROUP BY namespace
     ORDER BY namespace
     LIMIT :limit
"""
_NAMESPACES_FIRST = text(_NAMESPACES_SQL.format(after=""))
_NAMESPACES_AFTER = text(_NAMESPACES_SQL.format(after="AND namespace > :after"))

_ALL_KEYS_SQL = """
    SELECT key, forgotten FROM memory_records
     WHERE tenant_id = :tenant_id AND namespace = :namespace {after}
     ORDER BY key
     LIMIT :limit
"""
_ALL_KEYS_FIRST = text(_ALL_KEYS_SQL.format(after=""))
_ALL_KEYS_AFTER = text(_ALL_KEYS_SQL.format(after="AND key > :after"))


async def namespaces(db: AsyncSession, tenant_id: str, *, after: str | None, limit: int) -> list[NamespaceRow]:
    params: dict[str, Any] = {"tenant_id": tenant_id, "limit": limit}
    statement = _NAMESPACES_FIRST if after is None else _NAMESPACES_AFTER
    rows = await db.execute(statement, params if after is None else {**params, "after": after})
    return [
        NamespaceRow(
            namespace=r.namespace, live_keys=r.live_keys, forgotten_keys=r.forgotten_keys, updated_at=r.updated_at
        )
        for r in rows
    ]


async def all_keys(db: AsyncSession, tenant_id: str, namespace: str, *, after: str | None, limit: int) -> list[KeyRow]:
    params: dict[str, Any] = {"tenant_id": tenant_id, "namespace": namespace, "limit": limit}
    statement = _ALL_KEYS_FIRST if after is None else _ALL_KEYS_AFTER
    rows = await db.execute(statement, params if after is None else {**params, "after": after})
    return [KeyRow(key=r.key, forgotten=r.forgotten) for r in rows]


class MemoryCatalog:
    """Keyset pages over the tenant's namespaces and keys (one extra row tells whether another page exists)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def page_namespaces(
        self, tenant_id: str, *, cursor: str | None, limit: int, where: ReadFrom = PRIMARY
    ) -> tuple[list[NamespaceRow], str | None]:
        after = None if cursor is None else decode_cursor(cursor)
        rows = await self.db.read(where, lambda session: namespaces(session, tenant_id, after=after, limit=limit + 1))
        if len(rows) > limit:
            rows = rows[:limit]
            return rows, encode_cursor(rows[-1].namespace)
        return rows, None

    async def page_keys(
        self, tenant_id: str, namespace: str, *, cursor: str | None, limit: int, where: ReadFrom = PRIMARY
    ) -> tuple[list[KeyRow], str | None]:
        """Every key ever written in the namespace, tombstones included, in key order."""
        check_namespace(namespace)
        after = None if cursor is None else decode_cursor(cursor)
        rows = await self.db.read(
            where, lambda session: all_keys(session, tenant_id, namespace, after=after, limit=limit + 1)
        )
        if len(rows) > limit:
            rows = rows[:limit]
            return rows, encode_cursor(rows[-1].key)
        return rows, None
