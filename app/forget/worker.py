"""The forget worker: one per API process, claiming jobs from `forget_jobs` under a lease.

Any number of processes share the queue: a claim is `FOR UPDATE SKIP LOCKED`, so each job goes to one worker; the
worker renews its lease while the job runs, and a job whose worker died (lease expired) is claimed again by whoever
polls next, this process after a restart included. A submit in this process wakes its worker at once; others find
the job on their next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable

from app.db.database import Database
from app.db.models import ForgetJob
from app.forget.executor import ForgetExecutor
from app.forget.jobs import LeaseLost, Retry, ShredWait
from app.forget.repositories import jobs as jobs_repo
from app.forget.shredding import Shredder
from app.observability.metrics import Metrics

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 20  # a job that keeps finding its sessions busy fails with a clear error instead of looping


class ForgetWorker:
    def __init__(
        self,
        db: Database,
        metrics: Metrics,
        executor: ForgetExecutor,
        *,
        lease_s: float = 30.0,
        poll_s: float = 1.0,
        ready: Callable[[], bool] = lambda: True,
        wake: asyncio.Event | None = None,
        shredder: Shredder | None = None,
        retention: Callable[[str], Awaitable[str | None]] | None = None,
    ) -> None:
        self.db = db
        # A due retention sweep, run on every poll (app/retention/: leased per tenant, so one process runs each).
        self.retention = retention
        self.shredder = shredder  # retries pending shreds on every poll (app/forget/shredding.py)
        self.metrics = metrics
        self.executor = executor
        self.lease_s = lease_s
        self.poll_s = poll_s
        self.ready = ready
        self.wake = wake or asyncio.Event()  # a submit in this process sets it
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    async def run(self) -> None:
        while True:
            try:
                worked = await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:  # the database blinked: keep the worker alive, try again after a poll
                log.exception("forget worker step failed")
                worked = False
            if not worked:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), self.poll_s)
                self.wake.clear()

    async def step(self) -> bool:
        """Claim and run one job; False when there was none to run."""
        async with self.db.transaction() as tx:
            self.metrics.forget_queue_depth.set(await jobs_repo.queue_depth(tx))
        if self.shredder is not None:  # shreds need no model: before the readiness check
            await self.shredder.sweep()
            async with self.db.pg() as sql:
                pending = (await self.shredder.pending(sql)).values()
            self.metrics.erasure_pending.set(sum(p.jobs for p in pending))
            self.metrics.erasure_oldest_pending.set(max((p.oldest_s for p in pending), default=0.0))
        if self.retention is not None:  # it needs no model either: deletions and tombstones
            try:
                await self.retention(self.owner)
            except Exception:  # a sweep that fails is due again later; the forget jobs below must not wait on it
                log.exception("retention sweep failed")
        if not self.ready():
            return False
        async with self.db.transaction() as tx:
            job = await jobs_repo.claim(tx, self.owner, self.lease_s)
        if job is None:
            return False
        await self._run(job)
        return True

    async def _run(self, job: ForgetJob) -> None:
        heartbeat = asyncio.create_task(self._heartbeat(job.id), name=f"lease-{job.id}")
        try:
            await self.executor.execute(job, self.owner)
        except Retry as why:
            if job.attempts >= MAX_ATTEMPTS and not isinstance(why, ShredWait):
                await self.executor.give_up(job, self.owner, f"gave up after {job.attempts} attempts: {why}")
                return
            log.info("forget job requeued", extra={"forget_id": job.id, "why": str(why)})
            async with self.db.transaction() as tx:
                # It waits in the queue, not here: this worker goes on with the other jobs meanwhile.
                await jobs_repo.requeue(tx, job.id, self.owner, after_s=min(5.0, 0.2 * job.attempts))
        except LeaseLost:
            log.warning("forget job lease lost; another worker owns it now", extra={"forget_id": job.id})
        finally:
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)

    async def _heartbeat(self, job_id: str) -> None:
        """Renew the job's lease every third of it while the job runs. A failed renewal (the database blinked) is
        retried at the next beat, two more before the lease could lapse; only losing the lease ends it."""
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                async with self.db.transaction() as tx:
                    if not await jobs_repo.renew(tx, job_id, self.owner, self.lease_s):
                        return
            except Exception as exc:
                log.warning("forget job lease renewal failed", extra={"forget_id": job_id, "error": type(exc).__name__})
