"""A forget's erasure at rest: puncturing the leaves its job recorded, and saying when that happened.

A forget that erased sealed content (a memory record's values, for now) records their leaves on its job, in the
tombstone's transaction. Once that transaction committed, whoever committed it shreds them at once (`settle`: a
memory DELETE does, before it answers). With the key provider down the shred stays pending and the receipt says so
(`at_rest: pending`); the forget worker retries every pending one on each of its polls (`sweep`), and so do shreds
nobody settled at once (a record tombstoned by a forget job, as derived from what the job forgot). Shredding is
idempotent: a retry of a shred that happened is a no-op in the provider.

The thread routes create no forget jobs: what they removed is recorded in `thread_pending_shreds`
(app/threads/shredding.py), and `sweep` retries those too.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from app.db.database import Database
from app.db.statements import Sql
from app.forget.repositories import jobs as jobs_repo
from app.keys.content import Sealer
from app.keys.errors import Unavailable
from app.threads import shredding as thread_shredding
from app.threads.repositories import shreds as thread_shreds

log = logging.getLogger(__name__)

SWEEP_BATCH = 100


class Shredder:
    def __init__(self, db: Database, sealer: Sealer) -> None:
        self.db = db
        self.sealer = sealer

    async def settle(self, tenant_id: str, forget_id: str | None, leaves: list[int]) -> bool:
        """Puncture `leaves` and record job `forget_id`'s erasure at rest complete; False when the provider is down
        (the job's shred stays pending)."""
        if not leaves:
            return True
        try:
            await self.sealer.shred(tenant_id, leaves)
        except Unavailable as exc:
            log.warning("shred pending: key provider unavailable", extra={"forget_id": forget_id, "error": str(exc)})
            return False
        except Exception:
            # The forget itself committed: its answer must not be an error. The shred stays pending, loud in the
            # log, and the worker's sweep tries it again (a damaged cover stays loud there too).
            log.exception("shred pending: it failed", extra={"forget_id": forget_id})
            return False
        if forget_id is not None:
            async with self.db.pg() as sql:
                await jobs_repo.mark_shredded(sql, forget_id, leaves)
        return True

    async def sweep(self, *, limit: int = SWEEP_BATCH) -> int:
        """Settle up to `limit` pending shreds, oldest first; how many completed. A tenant's pending jobs are
        punctured together, one write per shard (what piles up while the provider was down costs one write per
        shard when it is back, not one per job), then each job is marked with the leaves it recorded."""
        async with self.db.pg() as sql:
            pending = await jobs_repo.pending_shreds(sql, limit=limit)
        by_tenant: dict[str, list[jobs_repo.PendingShred]] = defaultdict(list)
        for job in pending:
            by_tenant[job.tenant_id].append(job)
        done = 0
        for tenant_id, jobs in by_tenant.items():
            leaves = sorted({leaf for job in jobs for leaf in job.leaves})
            try:
                await self.sealer.shred(tenant_id, leaves)
            except Unavailable as exc:
                log.warning("shreds pending: key provider unavailable", extra={"jobs": len(jobs), "error": str(exc)})
                continue
            except Exception:  # a damaged cover (Tampered) must stay loud, and must not stop other tenants' shreds
                log.exception("shreds failed", extra={"forget_ids": [job.id for job in jobs]})
                continue
            async with self.db.pg() as sql:
                for job in jobs:
                    await jobs_repo.mark_shredded(sql, job.id, job.leaves)
            done += len(jobs)
        return done + await thread_shredding.sweep(self.db, self.sealer, limit=limit)

    async def pending(self, sql: Sql) -> dict[str, jobs_repo.PendingSummary]:
        """Pending shreds per tenant, forget jobs' and thread removals' (which create no forget job) counted
        together: what `lethe keys status` shows and the erasure metrics export."""
        found = await jobs_repo.pending_shreds_by_tenant(sql)
        for tenant_id, (records, oldest_s) in (await thread_shreds.pending_by_tenant(sql)).items():
            jobs = found.get(tenant_id)
            found[tenant_id] = jobs_repo.PendingSummary(
                records + (jobs.jobs if jobs else 0), max(oldest_s, jobs.oldest_s if jobs else 0.0)
            )
        return found
