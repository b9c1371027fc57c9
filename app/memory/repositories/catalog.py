"""SQL for the operator's catalog of memory: namespaces with their key counts, and every key of a namespace,
tombstones included. Names only, never values (so nothing here opens a ciphertext)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.db.statements import Sql, Statement
from app.memory.repositories.records import LIVE


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
_NAMESPACES_SQL = f"""
    SELECT namespace,
           count(*) FILTER (WHERE {LIVE}) AS live_keys,
           count(*) FILTER (WHERE forgotten) AS forgotten_keys,
           max(updated_at) AS updated_at
      FROM memory_records
     WHERE tenant_id = :tenant_id {{after}}
     GROUP BY namespace
     ORDER BY namespace
     LIMIT :limit
"""
_NAMESPACES_FIRST = Statement(_NAMESPACES_SQL.format(after=""))
_NAMESPACES_AFTER = Statement(_NAMESPACES_SQL.format(after="AND namespace > :after"))

_ALL_KEYS_SQL = """
    SELECT key, forgotten FROM memory_records
     WHERE tenant_id = :tenant_id AND namespace = :namespace {after}
     ORDER BY key
     LIMIT :limit
"""
_ALL_KEYS_FIRST = Statement(_ALL_KEYS_SQL.format(after=""))
_ALL_KEYS_AFTER = Statement(_ALL_KEYS_SQL.format(after="AND key > :after"))


async def namespaces(db: Sql, tenant_id: str, *, after: str | None, limit: int) -> list[NamespaceRow]:
    params: dict[str, Any] = {"tenant_id": tenant_id, "limit": limit}
    statement = _NAMESPACES_FIRST if after is None else _NAMESPACES_AFTER
    rows = await db.all(statement, params if after is None else {**params, "after": after})
    return [
        NamespaceRow(
            namespace=r["namespace"], live_keys=r["live_keys"], forgotten_keys=r["forgotten_keys"],
            updated_at=r["updated_at"],
        )
        for r in rows
    ]


async def all_keys(db: Sql, tenant_id: str, namespace: str, *, after: str | None, limit: int) -> list[KeyRow]:
    """Every key ever written in the namespace, tombstones included, in key order."""
    params: dict[str, Any] = {"tenant_id": tenant_id, "namespace": namespace, "limit": limit}
    statement = _ALL_KEYS_FIRST if after is None else _ALL_KEYS_AFTER
    rows = await db.all(statement, params if after is None else {**params, "after": after})
    return [KeyRow(key=r["key"], forgotten=r["forgotten"]) for r in rows]
