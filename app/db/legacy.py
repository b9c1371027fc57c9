"""Sealing a table's JSON content written before its sealing migration: one shape many domains share (a session's
settings, a tool environment, an OpenAI conversation's metadata or response's parameters: an id-keyed row, its
clear columns turned into one sealed JSON document under a fresh leaf of the row's session).

The domains declare their tables (`LegacyJson`, beside their sealing code) and `lethe keys seal`
(app/keys/admin.py) walks them as it walks memory and artifacts: in id order, a page per transaction, rows locked
`FOR UPDATE SKIP LOCKED` (a writer holding one is never waited for; the next pass takes it), each row sealed only
while it is still in the clear.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.db.statements import Row, Sql, Statement


class Sealer(Protocol):
    """What this needs of app/keys/content.py's `Sealer` (app/db sits below app/keys: it names no key type)."""

    async def leaf(self, tenant: str, stream: Hashable) -> int: ...

    async def seal_json(self, leaf: int, binding: Any, value: Any) -> bytes: ...


@dataclass(frozen=True)
class LegacyJson:
    table: str
    clear: tuple[str, ...]  # the clear columns, all set to `emptied` once sealed
    sealed: str  # the ciphertext column
    document: Callable[[Row], Any]  # what is sealed, from the row
    binding: Callable[[str, Row], Any]  # (tenant, row) → the `Binding` the ciphertext is bound to
    stream: Callable[[Row], Hashable]  # the leaf stream (the row's session: its leaves are neighbours)
    # How to find the tenant and session of a row (a join where the table has no tenant column of its own).
    source: str = ""
    tenant: str = "t.tenant_id"
    session: str = "t.session_id"
    emptied: dict[str, Any] = field(default_factory=dict)  # a clear column's value once sealed (default NULL)
    sets_tenant: bool = False  # the table's own tenant column was added with sealing: fill it in

    def _in_the_clear(self) -> str:
        return " OR ".join(f"t.{c} IS NOT NULL" for c in self.clear)

    def page(self) -> Statement:
        columns = ", ".join(f"t.{c}" for c in self.clear)
        return Statement(
            f"""
            SELECT t.id, {self.tenant} AS tenant_id, {self.session} AS session_id, {columns}
              FROM {self.table} t {self.source}
             WHERE t.id > :after AND t.leaf IS NULL AND ({self._in_the_clear()})
             ORDER BY t.id
             LIMIT :limit
               FOR UPDATE OF t SKIP LOCKED
            """
        )

    def update(self) -> Statement:
        emptied = ", ".join(f"{c} = {'NULL' if c not in self.emptied else ':e_' + c}" for c in self.clear)
        tenant = ", tenant_id = :tenant_id" if self.sets_tenant else ""
        return Statement(
            f"UPDATE {self.table} SET {self.sealed} = :sealed, leaf = :leaf, {emptied}{tenant}"
            " WHERE id = :id AND leaf IS NULL",
            json=tuple(f"e_{c}" for c in self.emptied),
        )

    def left(self) -> Statement:
        return Statement(
            f"SELECT count(*) AS rows FROM {self.table} t WHERE t.leaf IS NULL AND ({self._in_the_clear()})"
        )


async def seal_page(sql: Sql, sealer: Sealer, table: LegacyJson, after: str, limit: int) -> tuple[int, str | None]:
    """Seal up to `limit` clear rows of `table` after id `after` in the caller's transaction: (rows sealed, the
    cursor for the next page or None at the end)."""
    rows = await sql.all(table.page(), {"after": after, "limit": limit})
    sealed = 0
    for row in rows:
        tenant_id = row["tenant_id"]
        leaf = await sealer.leaf(tenant_id, table.stream(row))
        ciphertext = await sealer.seal_json(leaf, table.binding(tenant_id, row), table.document(row))
        params = {"id": row["id"], "leaf": leaf, "sealed": ciphertext,
                  **{f"e_{c}": value for c, value in table.emptied.items()}}
        if table.sets_tenant:
            params["tenant_id"] = tenant_id
        sealed += await sql.rowcount(table.update(), params)
    return sealed, (rows[-1]["id"] if len(rows) == limit else None)


async def left(sql: Sql, table: LegacyJson) -> int:
    row = await sql.one(table.left(), {})
    return int(row["rows"]) if row else 0
