"""What a tenant's memory holds, for the operator: namespaces with their key counts, and keys with tombstones.

Names only, never values: a forgotten key's name stays visible (its history already shows it), its value does not.
"""

from __future__ import annotations

from app.db.consistency import PRIMARY, ReadFrom
from app.db.database import Database
from app.memory.repositories import catalog as repo
from app.memory.repositories.catalog import KeyRow, NamespaceRow
from app.memory.validation import check_namespace, decode_cursor, encode_cursor


class MemoryCatalog:
    """Keyset pages over the tenant's namespaces and keys (one extra row tells whether another page exists)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def page_namespaces(
        self, tenant_id: str, *, cursor: str | None, limit: int, where: ReadFrom = PRIMARY
    ) -> tuple[list[NamespaceRow], str | None]:
        after = None if cursor is None else decode_cursor(cursor)
        rows = await self.db.read_pg(where, lambda sql: repo.namespaces(sql, tenant_id, after=after, limit=limit + 1))
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
        rows = await self.db.read_pg(
            where, lambda sql: repo.all_keys(sql, tenant_id, namespace, after=after, limit=limit + 1)
        )
        if len(rows) > limit:
            rows = rows[:limit]
            return rows, encode_cursor(rows[-1].key)
        return rows, None
