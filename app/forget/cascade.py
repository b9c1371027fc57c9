"""The memory service's cascade seam: forgetting a memory record forgets it in every session it reached."""

from __future__ import annotations

import logging
from collections.abc import Callable

from app.db.statements import Sql
from app.forget.jobs import DEFAULT_HORIZON_S
from app.forget.receipts import JobReceipt, MemoryEntry
from app.forget.repositories import jobs as jobs_repo
from app.forget.shredding import Shredder
from app.ids import new_id
from app.keys.content import Sealer
from app.memory.repositories.records import ErasedHistory
from app.sessions.repositories import artifacts as artifacts_repo

log = logging.getLogger(__name__)


class JobCascade:
    """The forget job that replays every session a forgotten record reached, created in the tombstone's own
    transaction (so it exists if and only if the tombstone commits).

    A record no session reached leaves the job nothing to replay: it is written finished (`succeeded`, its receipt
    holding the tombstone, exactly what a worker would write), so a memory forget costs no worker a claim. Asked after
    the tombstone, in a statement of its own, this cannot miss a session: one injecting the record holds it share-locked
    until it commits, so the tombstone waited for it and this statement's snapshot sees its artifacts; one created
    later reads the tombstone and injects nothing.

    The job records the leaves the forget erased; `shred` punctures them once the tombstone committed. Without a
    `shredder` (a record tombstoned inside a forget job's own transaction) the forget worker's sweep does it. Its
    reason is sealed with `sealer` (app/forget/repositories/sealing.py)."""

    def __init__(
        self, strategy: str = "selective_replay", reason: str | None = None, *, sealer: Sealer,
        on_finished: Callable[[str], None] = lambda strategy: None, shredder: Shredder | None = None,
        horizon_s: int = DEFAULT_HORIZON_S,
    ) -> None:
        self.strategy = strategy
        self.reason = reason
        self.sealer = sealer
        self.on_finished = on_finished  # counts a job finished here (Metrics.job_finished)
        self.shredder = shredder
        self.horizon_s = horizon_s

    async def shred(self, tenant_id: str, forget_id: str | None, leaves: list[int]) -> bool:
        """False when the shred stays pending (the provider refused it, or the worker's sweep does it)."""
        if self.shredder is None:
            return not leaves
        return await self.shredder.settle(tenant_id, forget_id, leaves)

    async def enqueue(
        self, sql: Sql, *, tenant_id: str, namespace: str, key: str, tombstone_version: int, erased: ErasedHistory
    ) -> str | None:
        memory = MemoryEntry(namespace=namespace, key=key, tombstone_version=tombstone_version)
        job_id = new_id("fgt")
        reached = await artifacts_repo.sessions_with_memory(sql, tenant_id, namespace, key)
        # Erasure at rest is promised only when everything erased was sealed: plaintext from before migration 0016
        # stays in dead tuples, WAL and backups whatever is shredded.
        promised = self.horizon_s if erased.leaves and not erased.plaintext else None
        receipt = JobReceipt(memory=memory, duration_ms=None if reached else 0, erasure_horizon_s=promised)
        await jobs_repo.queue(
            sql, self.sealer, id=job_id, tenant_id=tenant_id, strategy=self.strategy,
            target={"memory": {"namespace": namespace, "key": key}}, reason=self.reason,
            receipt=receipt.stored(), finished=not reached, shred_leaves=erased.leaves or None,
        )
        if not reached:
            self.on_finished(self.strategy)
            log.info("forget job finished", extra={
                "forget_id": job_id, "strategy": self.strategy, "status": "succeeded", "sessions": 0, "duration_ms": 0,
            })
        return job_id
