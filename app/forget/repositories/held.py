"""Forget jobs waiting on a legal hold (status `held`, app/forget/executor.py): parking one, and queueing them again
when their hold is released (app/holds/service.py)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import ForgetJob
from app.forget.repositories.sealing import seal_receipt
from app.keys.content import Sealer


async def hold(db: AsyncSession, sealer: Sealer, job: ForgetJob, receipt: dict[str, Any], hold_id: str) -> None:
    """held: released from its worker, waiting on legal hold `hold_id` (no worker claims it: `claim` takes queued
    jobs only); the sessions done so far stay in its receipt."""
    columns = await seal_receipt(sealer, job, receipt)
    await db.execute(
        update(ForgetJob)
        .where(ForgetJob.id == job.id)
        .values(status="held", held_by=hold_id, lease_owner=None, lease_expires_at=None, **columns)
    )


async def unhold(db: AsyncSession, tenant_id: str, hold_id: str) -> list[str]:
    """Queue again every job waiting on hold `hold_id` (it was released); their ids."""
    stmt = (
        update(ForgetJob)
        .where(ForgetJob.tenant_id == tenant_id, ForgetJob.held_by == hold_id, ForgetJob.status == "held")
        .values(status="queued", held_by=None, run_after=None)
        .returning(ForgetJob.id)
    )
    return sorted((await db.execute(stmt)).scalars().all())


async def held_by(db: AsyncSession, tenant_id: str, hold_id: str, *, limit: int) -> list[str]:
    """The jobs waiting on hold `hold_id`, oldest first."""
    stmt = (
        select(ForgetJob.id)
        .where(ForgetJob.tenant_id == tenant_id, ForgetJob.held_by == hold_id, ForgetJob.status == "held")
        .order_by(ForgetJob.created_at)
        .limit(limit)
    )
    return list((await db.execute(stmt)).scalars().all())
