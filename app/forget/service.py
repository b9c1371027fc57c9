"""Forget jobs: submit (or plan) a forget, confirm a plan, answer a job: what the routers and webhooks call.

A submitted forget is a row in `forget_jobs`; a worker in any API process claims it under a lease (worker.py) and
runs it (executor.py). A dry run plans without queueing (planner.py); a deletion request in plain words stores a plan
to confirm (proposals.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.database import Database
from app.db.notifications import JobEvents
from app.db.statements import InSession
from app.embeddings import Embedder
from app.engine.priority import Priority
from app.engine.slot import EngineSlot
from app.errors import Conflict, InvalidRequest, NotFound, NotReady
from app.forget import planner, proposals
from app.forget.cascade import JobCascade
from app.forget.cost import Yardstick
from app.forget.jobs import DEFAULT_HORIZON_S, DEFAULT_STRATEGY, JobView, Submission, view_of
from app.forget.locate import Target
from app.forget.per_policy import ForgetLookup
from app.forget.proposals import Proposal
from app.forget.receipts import JobReceipt, MemoryEntry
from app.forget.repositories import jobs as jobs_repo
from app.forget.shredding import Shredder
from app.forget.strategies import STRATEGIES, ForgetStrategy
from app.forget.target_sessions import check_target, sessions_reached
from app.holds.guard import refuse_namespace, refuse_session
from app.ids import new_id
from app.keys.content import Sealer
from app.memory.service import MemoryService
from app.runtime.blocks import Observation

WAIT_POLL_S = 1.0  # how often a waiter looks anyway (a lost notification costs at most this)


class ForgetService:
    def __init__(
        self, db: Database, engine: EngineSlot, embedder: Embedder, policies: ForgetLookup, *, sealer: Sealer,
        wait_s: float = 60.0, wake: asyncio.Event | None = None, events: JobEvents | None = None, shredder: Shredder,
        horizon_s: int = DEFAULT_HORIZON_S,
    ) -> None:
        self.db = db
        self.sealer = sealer  # a job's target, reason and receipt are sealed with it (app/forget/repositories)
        self.shredder = shredder  # a memory target's forget shreds its leaves as a memory DELETE does
        self.horizon_s = horizon_s
        self.slot = engine
        self.embedder = embedder
        self.policies = policies
        self.wait_s = wait_s
        self.wake = wake
        self.events = events

    async def submit(self, tenant_id: str, request: Submission) -> JobView:
        if request.plan_id is not None:
            return await self.confirm(tenant_id, request)
        assert request.target is not None
        target = Target.from_dict(request.target)
        strategy = STRATEGIES.named(request.strategy or DEFAULT_STRATEGY)
        async with self.db.transaction() as tx:
            session_ids = await sessions_reached(tx, self.sealer, tenant_id, target)
        if session_ids is None:  # an artifact that no longer exists: a repeated forget answers the first one
            assert target.artifact_id is not None
            async with self.db.transaction() as tx:
                earlier = await jobs_repo.succeeded_for_artifact(tx, self.sealer, tenant_id, target.artifact_id)
            if earlier is None:
                raise NotFound(f"no artifact {target.artifact_id!r}")
            return view_of(earlier)
        if request.dry_run:
            return await planner.plan(
                self.db, self.sealer, self.embedder, tenant_id, target, strategy, session_ids, request.reason,
                self.policies, Yardstick.of(self.slot.engine),
            )
        await self._check(tenant_id, target, strategy, session_ids)
        if request.shred_now:  # refused now, with nothing queued, rather than a job that cannot end
            await self.sealer.reachable(tenant_id)
        job_id = await self._enqueue(tenant_id, target, strategy, request.reason, shred_now=request.shred_now)
        self.notify()
        if request.wait:
            return await self.wait(tenant_id, job_id, self.wait_s)
        return await self.get(tenant_id, job_id)

    async def propose(
        self, tenant_id: str, session_id: str, observations: Sequence[Observation], *, generate: bool
    ) -> Proposal | None:
        """None when the turn is not a deletion request in plain words; else its stored plan and the reply."""
        request = proposals.deletion_request(observations, generate=generate)
        if request is None:
            return None
        return await proposals.propose(
            self.db, self.sealer, self.embedder, tenant_id, session_id, request, self.policies,
            Yardstick.of(self.slot.engine),
        )

    async def confirm(self, tenant_id: str, request: Submission) -> JobView:
        """Run a stored plan: the job goes from `planned` to `queued` (with the strategy given now, if any). A plan
        already confirmed answers its job as it stands, so a retried confirmation runs nothing twice."""
        assert request.plan_id is not None
        async with self.db.transaction() as tx:
            job = await jobs_repo.get(tx, self.sealer, tenant_id, request.plan_id, for_update=True)
            if job is None:
                raise NotFound(f"no forget plan {request.plan_id!r}")
            target = Target.from_dict(job.target)
            strategy = STRATEGIES.named(request.strategy or job.strategy)
        if request.dry_run:
            if job.status != "planned":
                raise Conflict(f"forget plan {request.plan_id!r} was already confirmed")
            assert target.session_id is not None
            return await planner.plan(
                self.db, self.sealer, self.embedder, tenant_id, target, strategy, [target.session_id],
                request.reason, self.policies, Yardstick.of(self.slot.engine),
            )
        if job.status == "planned":
            await self.validate(tenant_id, target, strategy)
            if request.shred_now:
                await self.sealer.reachable(tenant_id)
            async with self.db.transaction() as tx:
                confirmed = await jobs_repo.confirm_plan(
                    tx, self.sealer, job, strategy.name, request.reason or job.reason, shred_now=request.shred_now
                )
            if confirmed:
                self.notify()
        if request.wait:
            return await self.wait(tenant_id, job.id, self.wait_s)
        return await self.get(tenant_id, job.id)

    async def get(self, tenant_id: str, job_id: str) -> JobView:
        async with self.db.transaction() as tx:
            job = await jobs_repo.get(tx, self.sealer, tenant_id, job_id)
        if job is None:
            raise NotFound(f"no forget job {job_id!r}")
        return view_of(job)

    async def wait(self, tenant_id: str, job_id: str, timeout_s: float) -> JobView:
        """The job once it ended, or as it stands when `timeout_s` ran out (any process may be running it): woken by
        the job's status events (app/db/notifications.py), with a slow poll behind them in case they are down."""
        deadline = time.monotonic() + timeout_s
        with self.events.watch(job_id) if self.events else contextlib.nullcontext(asyncio.Event()) as changed:
            while True:
                changed.clear()
                view = await self.get(tenant_id, job_id)
                left = deadline - time.monotonic()
                if view.finished or left <= 0:
                    return view
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), min(left, WAIT_POLL_S))

    async def provide(self, tenant_id: str, job_id: str, tool_call_id: str, content: str) -> JobView:
        """The client's result for the call a needs_input job waits on; the job is queued again."""
        async with self.db.transaction() as tx:
            job = await jobs_repo.get(tx, self.sealer, tenant_id, job_id, for_update=True)
            if job is None:
                raise NotFound(f"no forget job {job_id!r}")
            receipt = JobReceipt.load(job.receipt)
            if job.status != "needs_input" or receipt.pending is None:
                raise Conflict(f"forget job {job_id!r} is {job.status}, not waiting for a tool result")
            waits_for = receipt.pending.tool_call["id"]
            if waits_for != tool_call_id:
                raise InvalidRequest(f"the job waits for tool call {waits_for!r}")
            provided = {**receipt.provided, tool_call_id: content}
            resumed = receipt.model_copy(update={"provided": provided, "pending": None})
            await jobs_repo.requeue_with(tx, self.sealer, job, resumed.stored())
            # The answer is the job as this request left it (queued), read before any worker is woken: read after,
            # it would say whatever a worker had made of it meanwhile.
            requeued = await jobs_repo.get(tx, self.sealer, tenant_id, job_id)
            assert requeued is not None  # locked above
            view = view_of(requeued)
        self.notify()
        return view

    async def validate(self, tenant_id: str, target: Target, strategy: ForgetStrategy) -> None:
        """What `submit` checks before queueing, for callers that queue themselves (404, 422, 503)."""
        async with self.db.transaction() as tx:
            session_ids = await sessions_reached(tx, self.sealer, tenant_id, target)
        if session_ids is None:
            raise NotFound(f"no artifact {target.artifact_id!r}")
        await self._check(tenant_id, target, strategy, session_ids)

    async def enqueue_in(
        self, tx: AsyncSession, tenant_id: str, target: Target, strategy: ForgetStrategy, reason: str | None,
        receipt: JobReceipt | None = None, *, priority: Priority = Priority.FORGET, shred_now: bool = False,
    ) -> str:
        """Queue a job in the caller's transaction (a webhook records its delivery in the same one). `priority`: its
        engine work's (a detector webhook's job: DETECTOR; app/engine/priority.py)."""
        job = await jobs_repo.create(
            tx, self.sealer, id=new_id("fgt"), tenant_id=tenant_id, status="queued", strategy=strategy.name,
            target=target.to_dict(), reason=reason, receipt=(receipt or JobReceipt()).stored(), attempts=0,
            priority=int(priority), shred_now=shred_now,
        )
        return job.id

    def notify(self) -> None:
        if self.wake is not None:
            self.wake.set()

    async def _check(self, tenant_id: str, target: Target, strategy: ForgetStrategy, session_ids: list[str]) -> None:
        """Refuse, before queueing, what the strategy cannot do with this target (422), what needs the model
        when it is not loaded (503), or what a legal hold covers (409)."""
        if strategy.replays and session_ids and not await self.slot.available():
            raise NotReady("the model is not loaded yet", headers={"Retry-After": "5"})
        async with self.db.transaction() as tx:
            await check_target(tx, self.sealer, tenant_id, target, strategy, session_ids, self.policies)
            # A legal hold over what the job would erase refuses it now (409); a job queued before the hold waits on
            # it (app/forget/executor.py).
            if target.namespace is not None:
                await refuse_namespace(InSession(tx), tenant_id, target.namespace)
            else:
                for session_id in session_ids:
                    await refuse_session(InSession(tx), tenant_id, session_id)

    async def _enqueue(
        self, tenant_id: str, target: Target, strategy: ForgetStrategy, reason: str | None, *, shred_now: bool
    ) -> str:
        receipt = JobReceipt()
        if target.namespace is not None and strategy.forgets_memory:
            assert target.key is not None
            cascade = JobCascade(
                strategy.name, reason, sealer=self.sealer, shredder=self.shredder, horizon_s=self.horizon_s
            )
            memory = MemoryService(self.db, self.sealer, cascade=cascade)
            outcome = await memory.forget(tenant_id, target.namespace, target.key, shred_now=shred_now)
            if outcome.forget_id is not None:
                return outcome.forget_id
            receipt = JobReceipt(memory=MemoryEntry(
                namespace=target.namespace, key=target.key, tombstone_version=outcome.version
            ))
        async with self.db.transaction() as tx:
            return await self.enqueue_in(tx, tenant_id, target, strategy, reason, receipt, shred_now=shred_now)
