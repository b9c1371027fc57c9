"""Retention: the policies (the tenant's default, a subject's override, a memory namespace's override), and the
sweep that erases what outlived them. For a memory key the namespace's own limit wins over its subjects', which wins
over the tenant's (app/retention/repository.py; docs/subjects.md, "Retention").

Every process's forget worker calls `sweep` on each poll. A sweep leases one tenant whose sweep is due (a row of
`retention_sweeps`, `FOR UPDATE SKIP LOCKED`: each due sweep runs in one process, and one whose process died is taken
again once its lease lapsed), erases through the machinery every erasure uses (`SessionService.delete` with
`erasure=True`, `MemoryService.forget` with source `retention`, each recording and shredding its own leaves), skips
what a legal hold covers (recorded on the hold, event `skipped`), and records one finished forget job, strategy
`retention`, whose `retention` receipt names it all and whose `erasure` covers every leaf of it. A sweep that found
nothing expired records nothing. The next one is due `sweep_s` later; setting a policy makes it due now.

`clock` is the sweep's idea of now: what "idle 30 days" is measured against. Tests move it forward instead of
sleeping or back-dating rows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from app.db.database import Database
from app.db.statements import InSession
from app.errors import LegalHold, NotFound
from app.forget.receipts import JobReceipt, RetentionEntry
from app.forget.repositories import jobs as jobs_repo
from app.forget.shredding import Shredder
from app.holds import repository as holds_repo
from app.ids import new_id
from app.keys.content import Sealer
from app.memory.service import MemoryService
from app.observability.metrics import Metrics
from app.retention import repository as repo
from app.retention.schemas import (
    MAX_LISTED,
    NamespaceRetentionPut,
    RetentionNamespaceOut,
    RetentionOut,
    RetentionPolicyOut,
    RetentionPut,
)
from app.sessions.service import SessionService
from app.subjects import repository as subjects_repo

log = logging.getLogger(__name__)

STRATEGY = "retention"
PAGE = 200


class RetentionService:
    def __init__(self, db: Database, sealer: Sealer, sessions: SessionService, memory: MemoryService,
                 shredder: Shredder, metrics: Metrics, *, horizon_s: int, sweep_s: float, lease_s: float = 300.0,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.db = db
        self.sealer = sealer
        self.sessions = sessions
        self.memory = memory
        self.shredder = shredder
        self.metrics = metrics
        self.horizon_s = horizon_s
        self.sweep_s = sweep_s
        self.lease_s = lease_s
        self.clock = clock

    async def put(self, tenant_id: str, subject_id: str | None, body: RetentionPut) -> RetentionOut:
        """The tenant's default (`subject_id` None) or a subject's override (made if new)."""
        async with self.db.transaction() as tx:
            if subject_id is not None:
                await subjects_repo.ensure(tx, tenant_id, subject_id)
            await repo.put(InSession(tx), tenant_id, subject_id or repo.DEFAULT, body.sessions_max_idle_days,
                           body.memory_max_age_days)
        return await self.get(tenant_id)

    async def put_namespace(self, tenant_id: str, namespace: str, body: NamespaceRetentionPut) -> RetentionOut:
        """A memory namespace's own override (made if new): for its keys it wins over its subjects' and the
        tenant's; null defers to them. Nothing else is made: a namespace is a name, not a row of its own."""
        async with self.db.transaction() as tx:
            await repo.put_namespace(InSession(tx), tenant_id, namespace, body.memory_max_age_days)
        return await self.get(tenant_id)

    async def get(self, tenant_id: str) -> RetentionOut:
        async with self.db.transaction() as tx:
            sql = InSession(tx)
            found = await repo.policies(sql, tenant_id, MAX_LISTED + 1)
            namespaces = await repo.namespace_policies(sql, tenant_id, MAX_LISTED)
            next_at, last = await repo.sweep_state(sql, tenant_id)
        default = next((p for p in found if p.subject_id == repo.DEFAULT), None)
        return RetentionOut(
            sessions_max_idle_days=default.sessions_max_idle_days if default else None,
            memory_max_age_days=default.memory_max_age_days if default else None,
            subjects=[RetentionPolicyOut(subject_id=p.subject_id, sessions_max_idle_days=p.sessions_max_idle_days,
                                         memory_max_age_days=p.memory_max_age_days, updated_at=p.updated_at)
                      for p in found if p.subject_id != repo.DEFAULT][:MAX_LISTED],
            namespaces=[RetentionNamespaceOut(namespace=n.namespace, memory_max_age_days=n.memory_max_age_days,
                                              updated_at=n.updated_at) for n in namespaces],
            next_sweep_at=next_at, last_sweep_forget_id=last,
        )

    async def sweep(self, owner: str) -> str | None:
        """Run one due sweep, if any; the receipt's job id when it erased or kept something."""
        now = self.clock()
        async with self.db.transaction() as tx:
            tenant_id = await repo.claim(InSession(tx), owner, now, self.lease_s)
        if tenant_id is None:
            return None
        forget_id = None
        try:
            forget_id = await self._sweep(tenant_id, now)
        finally:  # a failed sweep is due again after the interval, not at once (the worker logs the failure)
            async with self.db.transaction() as tx:
                await repo.done(InSession(tx), tenant_id, owner, now + timedelta(seconds=self.sweep_s), forget_id)
        return forget_id

    async def _sweep(self, tenant_id: str, now: datetime) -> str | None:
        entry = RetentionEntry()
        leaves: list[int] = []
        after = ""
        while True:
            async with self.db.transaction() as tx:
                page = await repo.expired_sessions(InSession(tx), tenant_id, now, after, PAGE)
            for session_id in page:
                try:
                    deleted = await self.sessions.delete(tenant_id, session_id, erasure=True)
                except NotFound:  # deleted meanwhile
                    continue
                except LegalHold as hold:
                    entry.held.append({"hold_id": hold.hold_id, "session_id": session_id})
                    continue
                entry.sessions.append(session_id)
                leaves += deleted.erased.leaves
                entry.jobs += [deleted.forget_id] if deleted.forget_id else []
            if len(page) < PAGE:
                break
            after = page[-1]
        position = ("", "")
        while True:
            async with self.db.transaction() as tx:
                keys = await repo.expired_keys(InSession(tx), tenant_id, now, position, PAGE)
            for namespace, key in keys:
                try:
                    outcome = await self.memory.forget(tenant_id, namespace, key, source="retention")
                except LegalHold as hold:
                    entry.held.append({"hold_id": hold.hold_id, "namespace": namespace, "key": key})
                    continue
                entry.memory_keys += not outcome.already_forgotten
                leaves += outcome.leaves
                entry.jobs += [outcome.forget_id] if outcome.forget_id else []
            if len(keys) < PAGE:
                break
            position = keys[-1]
        if not (entry.sessions or entry.memory_keys or entry.held):
            return None
        return await self._record(tenant_id, entry, sorted(set(leaves)))

    async def _record(self, tenant_id: str, entry: RetentionEntry, shred: list[int]) -> str:
        receipt = JobReceipt(retention=entry, duration_ms=0, erasure_horizon_s=self.horizon_s if shred else None)
        job_id = new_id("fgt")
        async with self.db.transaction() as tx:
            sql = InSession(tx)
            await jobs_repo.queue(sql, self.sealer, id=job_id, tenant_id=tenant_id, strategy=STRATEGY,
                                  target={"retention": True}, reason=None, receipt=receipt.stored(), finished=True,
                                  shred_leaves=shred or None)
            for held in entry.held:  # the hold's audit trail says what it kept from retention
                detail = {"forget_id": job_id, **{k: v for k, v in held.items() if k != "hold_id"}}
                await holds_repo.event(sql, tenant_id, held["hold_id"], "skipped", None, detail)
        await self.shredder.settle(tenant_id, job_id, shred)
        self.metrics.erasures.labels(reason="retention", kind="session").inc(len(entry.sessions))
        self.metrics.erasures.labels(reason="retention", kind="memory_key").inc(entry.memory_keys)
        self.metrics.erasures_held.labels(reason="retention").inc(len(entry.held))
        log.info("retention sweep", extra={"forget_id": job_id, "sessions": len(entry.sessions),
                                           "memory_keys": entry.memory_keys, "held": len(entry.held)})
        return job_id
