"""Reading detector-webhook deliveries page by page: which flags arrived, and the forget each one started."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from app import pagination
from app.db.consistency import PRIMARY, ReadFrom
from app.db.database import Database
from app.forget.repositories import jobs as jobs_repo


@dataclass(frozen=True)
class Delivery:
    webhook_id: str
    forget_id: str | None
    forget_status: str | None
    received_at: datetime


async def page_deliveries(
    db: Database, tenant_id: str, *, cursor: str | None, limit: int, where: ReadFrom = PRIMARY
) -> tuple[list[Delivery], str | None]:
    after = None if cursor is None else pagination.decode(cursor)
    rows = await db.read(where, lambda tx: jobs_repo.deliveries(tx, tenant_id, after=after, limit=limit + 1))
    positions = [pagination.Position(row.received_at, row.webhook_id) for row, _ in rows]
    page = [Delivery(row.webhook_id, row.forget_id, status, row.received_at) for row, status in rows[:limit]]
    return page, pagination.next_cursor(positions, limit)
