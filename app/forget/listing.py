"""Reading forget jobs page by page (the operator's view: what ran, what waits, what failed)."""

from __future__ import annotations

from app import pagination
from app.db.consistency import PRIMARY, ReadFrom
from app.db.database import Database
from app.forget.jobs import JobView, view_of
from app.forget.repositories import jobs as jobs_repo
from app.keys.content import Sealer


async def page_jobs(
    db: Database, sealer: Sealer, tenant_id: str, *, cursor: str | None, limit: int, status: str | None,
    session_id: str | None, where: ReadFrom = PRIMARY,
) -> tuple[list[JobView], str | None]:
    after = None if cursor is None else pagination.decode(cursor)
    rows = await db.read(
        where,
        lambda tx: jobs_repo.page(
            tx, sealer, tenant_id, after=after, limit=limit + 1, status=status, session_id=session_id
        ),
    )
    positions = [pagination.Position(r.created_at, r.id) for r in rows]
    return [view_of(r) for r in rows[:limit]], pagination.next_cursor(positions, limit)
