"""The memory service's cascade seam: forgetting a memory record forgets it in every session it reached."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.repositories import forget_jobs as jobs_repo
from app.forget.receipts import JobReceipt, MemoryReceipt
from app.ids import new_id


class JobCascade:
    """The forget job that replays every session a forgotten record reached, created in the tombstone's own
    transaction (so it exists if and only if the tombstone commits)."""

    def __init__(self, strategy: str = "selective_replay", reason: str | None = None) -> None:
        self.strategy = strategy
        self.reason = reason

    async def enqueue(
        self, session: AsyncSession, *, tenant_id: str, namespace: str, key: str, tombstone_version: int
    ) -> str | None:
        memory = MemoryReceipt(namespace=namespace, key=key, tombstone_version=tombstone_version)
        job = await jobs_repo.create(
            session,
            id=new_id("fgt"),
            tenant_id=tenant_id,
            status="queued",
            strategy=self.strategy,
            target={"memory": {"namespace": namespace, "key": key}},
            reason=self.reason,
            receipt=JobReceipt(memory=memory).stored(),
            attempts=0,
        )
        return job.id
