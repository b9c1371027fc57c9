"""Legal holds: placing one, reading its audit trail, releasing it and queueing the erasures it deferred.

A hold covers one scope (a subject, a session or a memory namespace). While it stands, every erasure of what it
covers answers 409 `legal_hold` (app/holds/guard.py, inside the erasing transaction), retention skips it, and a
subject's erasure skips the held part, says so in its receipt and is recorded as deferred on the hold. A forget job
that reaches a held session (a memory key's cascade into it, a job queued before the hold) waits on the hold in
status `held` (app/forget/executor.py), and so does a subject's erasure queued before a hold on the subject.
Releasing the hold queues each deferred erasure again and each waiting job (either skips whatever another hold
still covers, and is deferred there).
Every change is an event in `hold_events` with the API key that made it.
"""

from __future__ import annotations

from app.db.database import Database
from app.db.statements import InSession
from app.errors import LegalHold, NotFound
from app.forget.repositories import held as held_repo
from app.holds import repository as repo
from app.holds.schemas import MAX_LISTED, HoldCreate, HoldEventOut, HoldOut
from app.ids import new_id
from app.subjects import repository as subjects_repo
from app.subjects.erasure import SubjectErasure


class HoldService:
    def __init__(self, db: Database, erasure: SubjectErasure) -> None:
        self.db = db
        self.erasure = erasure

    async def place(self, tenant_id: str, key_id: str | None, body: HoldCreate) -> HoldOut:
        scope = body.model_dump(include={"subject_id", "session_id", "namespace"}, exclude_none=True)
        (kind, value), = scope.items()
        hold_id = new_id("hld")
        async with self.db.transaction() as tx:
            sql = InSession(tx)
            # First the exclusive lock: an erasure of the scope in flight commits before the hold is recorded.
            await repo.lock_scope(sql, tenant_id, kind.removesuffix("_id"), value)
            if body.session_id is not None and not await repo.session_exists(sql, tenant_id, body.session_id):
                raise NotFound(f"no session {body.session_id!r}")
            if body.subject_id is not None:
                await subjects_repo.ensure(tx, tenant_id, body.subject_id)
            await repo.insert(sql, tenant_id, hold_id, scope, body.reason, key_id)
            await repo.event(sql, tenant_id, hold_id, "placed", key_id, scope)
        return await self.get(tenant_id, hold_id)

    async def get(self, tenant_id: str, hold_id: str) -> HoldOut:
        async with self.db.transaction() as tx:
            sql = InSession(tx)
            row = await repo.get(sql, tenant_id, hold_id)
            if row is None:
                raise NotFound(f"no hold {hold_id!r}")
            trail = await repo.events(sql, tenant_id, hold_id)
            waiting = await repo.deferred(sql, tenant_id, hold_id)
            jobs = await held_repo.held_by(tx, tenant_id, hold_id, limit=MAX_LISTED)
        return HoldOut(**row.__dict__, deferred=waiting, jobs=jobs, events=[HoldEventOut(**e) for e in trail])

    async def release(self, tenant_id: str, key_id: str | None, hold_id: str) -> HoldOut:
        """Release the hold (again: a no-op) and queue the erasures it deferred, each dropped from the hold once
        queued, so a release interrupted half-way is finished by releasing again."""
        async with self.db.transaction() as tx:
            sql = InSession(tx)
            row = await repo.get(sql, tenant_id, hold_id, for_update=True)
            if row is None:
                raise NotFound(f"no hold {hold_id!r}")
            if row.released_at is None:
                await repo.release(sql, tenant_id, hold_id, key_id)
                await repo.event(sql, tenant_id, hold_id, "released", key_id)
            # Forget jobs that reached what it covers (a cascade, a job queued before it) run again: queued with the
            # release, so a worker claims them once it committed (the status change wakes every process's worker).
            ran = await held_repo.unhold(tx, tenant_id, hold_id)
            waiting = await repo.deferred(sql, tenant_id, hold_id)
        for subject_id in waiting:
            try:
                job = await self.erasure.submit(tenant_id, subject_id, wait=False)
                ran.append(job.id)
            except LegalHold as still:  # another hold covers the whole subject now: it waits on that one instead
                async with self.db.transaction() as tx:
                    await repo.defer(InSession(tx), tenant_id, still.hold_id, subject_id)
            async with self.db.transaction() as tx:
                await repo.undefer(InSession(tx), tenant_id, hold_id, subject_id)
        released = await self.get(tenant_id, hold_id)
        return released.model_copy(update={"erasures": ran})
