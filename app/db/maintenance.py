"""Table maintenance the operator's commands run: VACUUM (after `lethe keys seal`, app/keys/admin.py)."""

from __future__ import annotations

from app.db.statements import Sql, Statement


async def vacuum(sql: Sql, table: str, *, full: bool) -> None:
    """VACUUM (ANALYZE) `table`, or VACUUM FULL: the table rewritten into new files under an exclusive lock, so its
    files keep no dead tuple. `table` comes from the domains' declarations, never from a request. Run it on a
    connection with no transaction open (`Database.pg`)."""
    options = "FULL, ANALYZE" if full else "ANALYZE"
    await sql.rowcount(Statement(f"VACUUM ({options}) {table}"), {})
