"""Forget jobs: submit (or plan) a forget, run it durably, answer its receipt.

A submitted forget is a row in `forget_jobs`; a worker in any API process claims it under a lease (worker.py) and
calls `execute`. Each session is forgotten inside that session's row lock, in one transaction: the strategy computes
the rebuilt state aside (in memory), then the old suffix is deleted, the new one inserted, the epoch bumped and the
session's receipt entry saved, all in one commit. A crash before the commit leaves the session as it was and the job
claimable again once its lease expires; a crash after it leaves a receipt entry that the retry skips. So a forget is
atomic per session, durable, and idempotent.

The target's text is needed while the job runs (and must survive a crash), so it is stored with the job; when the
job ends it is replaced by its length. Receipts hold artifact ids, counts and digests, never a copy of the text.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AgentSession, Artifact, ForgetJob
from app.db.repositories import artifacts as artifacts_repo
from app.db.repositories import forget_jobs as jobs_repo
from app.db.repositories import sessions as sessions_repo
from app.db.repositories import tools as tools_repo
from app.db.session import Database
from app.embeddings import Embedder
from app.engine.slot import EngineSlot
from app.errors import Conflict, InvalidRequest, NotFound, NotReady, SessionBusy
from app.forget.plan import Restore, Tainted, closure, compute_cost, replies_in, restore_point, state_sha256
from app.forget.replay import NeedsInput, Rebuilt
from app.forget.requests import MEANING_SIMILARITY, DeletionRequest
from app.forget.rewrite import Rewritten
from app.forget.strategies import STRATEGIES, ForgetStrategy, SessionWork
from app.forget.targets import Located, Target, locate_in
from app.ids import new_id
from app.memory import repository as memory_repo
from app.memory.service import MemoryService, forget_in
from app.memory.validation import check_key, check_namespace
from app.observability.metrics import Metrics
from app.runtime.blocks import MODEL_KINDS, ROLE_OF
from app.runtime.handles import HandleRegistry
from app.runtime.salts import rotates
from app.sessions.service import SessionService
from app.tool_calls import ToolCall

log = logging.getLogger(__name__)

DEFAULT_MIN_SIMILARITY = 0.5
DEFAULT_STRATEGY = "selective_replay"
TERMINAL = ("succeeded", "failed", "needs_input")  # needs_input: finished until the client answers


class LeaseLost(Exception):
    """Another worker took the job over (this one stalled past its lease): nothing of this attempt may commit."""


class Retry(Exception):
    """The job cannot progress now (session busy, model loading): requeue it."""


@dataclass(frozen=True)
class Submission:
    target: dict[str, Any] | None = None  # None: `plan_id` names a stored plan to confirm
    strategy: str | None = None  # None: the plan's, or selective_replay
    dry_run: bool = False
    wait: bool = False
    reason: str | None = None
    plan_id: str | None = None


@dataclass
class JobView:
    id: str
    status: str
    strategy: str
    target: dict[str, Any]
    sessions: list[dict[str, Any]] = field(default_factory=list)
    memory: dict[str, Any] | None = None
    suppressed_side_effects: list[dict[str, Any]] = field(default_factory=list)
    committed_side_effects: list[dict[str, Any]] = field(default_factory=list)
    pending: dict[str, Any] | None = None
    derived_memory: list[dict[str, Any]] = field(default_factory=list)
    duration_ms: int | None = None
    error: str | None = None
    reason: str | None = None
    dry_run: bool = False
    created_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL or self.dry_run


def view_of(job: ForgetJob) -> JobView:
    receipt = job.receipt or {}
    return JobView(
        id=job.id,
        status=job.status,
        strategy=job.strategy,
        target=job.target,
        sessions=list(receipt.get("sessions", [])),
        memory=receipt.get("memory"),
        suppressed_side_effects=list(receipt.get("suppressed_side_effects", [])),
        committed_side_effects=list(receipt.get("committed_side_effects", [])),
        pending=receipt.get("pending"),
        derived_memory=list(receipt.get("derived_memory", [])),
        duration_ms=receipt.get("duration_ms"),
        error=job.error,
        reason=job.reason,
        created_at=job.created_at,
        finished_at=job.finished_at,
    )


class JobCascade:
    """The memory service's cascade seam: the forget job that replays every session a forgotten record reached,
    created in the tombstone's own transaction (so it exists if and only if the tombstone commits)."""

    def __init__(self, strategy: str = "selective_replay", reason: str | None = None) -> None:
        self.strategy = strategy
        self.reason = reason

    async def enqueue(
        self, session: AsyncSession, *, tenant_id: str, namespace: str, key: str, tombstone_version: int
    ) -> str | None:
        job = await jobs_repo.create(
            session,
            id=new_id("fgt"),
            tenant_id=tenant_id,
            status="queued",
            strategy=self.strategy,
            target={"memory": {"namespace": namespace, "key": key}},
            reason=self.reason,
            receipt={"memory": {"namespace": namespace, "key": key, "tombstone_version": tombstone_version}},
            attempts=0,
        )
        return job.id


class ForgetService:
    def __init__(
        self,
        db: Database,
        engine: EngineSlot,
        handles: HandleRegistry,
        sessions: SessionService,
        metrics: Metrics,
        embedder: Embedder,
        *,
        lock_timeout_s: float = 120.0,
        wait_s: float = 60.0,
        wake: asyncio.Event | None = None,
    ) -> None:
        self.db = db
        self.slot = engine
        self.handles = handles
        self.sessions = sessions
        self.metrics = metrics
        self.embedder = embedder
        self.lock_timeout_s = lock_timeout_s
        self.wait_s = wait_s
        self.wake = wake

    # -- submit, plan, read -------------------------------------------------------------------------------------

    async def submit(self, tenant_id: str, request: Submission) -> JobView:
        if request.plan_id is not None:
            return await self.confirm(tenant_id, request)
        assert request.target is not None
        target = Target.from_dict(request.target)
        strategy = STRATEGIES[request.strategy or DEFAULT_STRATEGY]
        session_ids = await self._sessions_for(tenant_id, target)
        if session_ids is None:  # an artifact that no longer exists: a repeated forget answers the first one
            assert target.artifact_id is not None
            async with self.db.transaction() as tx:
                earlier = await jobs_repo.succeeded_for_artifact(tx, tenant_id, target.artifact_id)
            if earlier is None:
                raise NotFound(f"no artifact {target.artifact_id!r}")
            return view_of(earlier)
        if request.dry_run:
            return await self.plan(tenant_id, target, strategy, session_ids, request.reason)
        await self._check(tenant_id, target, strategy, session_ids)
        job_id = await self._enqueue(tenant_id, target, strategy, request.reason)
        self.notify()
        if request.wait:
            return await self.wait(tenant_id, job_id, self.wait_s)
        return await self.get(tenant_id, job_id)

    async def propose(self, tenant_id: str, session_id: str, request: DeletionRequest) -> JobView | None:
        """A deletion request made in plain words inside a session (requests.py): match M, plan the forget and store
        the plan as a job in status `planned` (its target is M's ids only, never the words), or None when nothing
        matches. Nothing is deleted until the client confirms the plan (`confirm`)."""
        async with self.db.transaction() as tx:
            session = await sessions_repo.get(tx, tenant_id, session_id)
            if session is None:
                raise NotFound(f"no session {session_id!r}")
            ids = await self._match(tx, session, request)
        if not ids:
            return None
        target = Target(session_id=session_id, artifact_ids=tuple(ids))
        strategy = STRATEGIES[DEFAULT_STRATEGY]
        plan = await self.plan(tenant_id, target, strategy, [session_id], None)
        if not plan.sessions:
            return None
        async with self.db.transaction() as tx:
            job = await jobs_repo.create(
                tx, id=new_id("fgt"), tenant_id=tenant_id, status="planned", strategy=strategy.name,
                target=target.to_dict(), reason="requested in the session", receipt={"sessions": plan.sessions},
                attempts=0,
            )
        return view_of(job)

    async def _match(self, tx: AsyncSession, session: AgentSession, request: DeletionRequest) -> list[str]:
        """M for a request in plain words: the session's live messages it names (observations; the replies derived
        from them follow through the closure), in log order."""
        messages = [
            a for a in await artifacts_repo.list_live(tx, session.tenant_id, session.id)
            if a.kind not in MODEL_KINDS and a.kind not in ("system", "instruction")
        ]
        if request.how == "id":
            if request.what.isdigit():
                users = [a for a in messages if a.kind == "user"]
                index = int(request.what) - 1
                return [users[index].id] if 0 <= index < len(users) else []
            return [a.id for a in messages if a.id == request.what]
        if request.how == "text":
            return [a.id for a in messages if request.what in a.content]
        if request.how == "keyword":
            kinds = sorted({a.kind for a in messages})
            return await artifacts_repo.keyword_matches(tx, session.id, request.what, kinds) if kinds else []
        similar = set(await self._similar(tx, session.id, request.what, MEANING_SIMILARITY))
        wanted = request.what.casefold()
        return [a.id for a in messages if a.id in similar or wanted in a.content.casefold()]

    async def confirm(self, tenant_id: str, request: Submission) -> JobView:
        """Run a stored plan: the job goes from `planned` to `queued` (with the strategy given now, if any). A plan
        already confirmed answers its job as it stands, so a retried confirmation runs nothing twice."""
        assert request.plan_id is not None
        async with self.db.transaction() as tx:
            job = await jobs_repo.get(tx, tenant_id, request.plan_id, for_update=True)
            if job is None:
                raise NotFound(f"no forget plan {request.plan_id!r}")
            target = Target.from_dict(job.target)
            strategy = STRATEGIES[request.strategy or job.strategy]
        if request.dry_run:
            if job.status != "planned":
                raise Conflict(f"forget plan {request.plan_id!r} was already confirmed")
            assert target.session_id is not None
            return await self.plan(tenant_id, target, strategy, [target.session_id], request.reason)
        if job.status == "planned":
            await self.validate(tenant_id, target, strategy)
            async with self.db.transaction() as tx:
                confirmed = await jobs_repo.confirm_plan(
                    tx, tenant_id, job.id, strategy.name, request.reason or job.reason
                )
            if confirmed:
                self.notify()
        if request.wait:
            return await self.wait(tenant_id, job.id, self.wait_s)
        return await self.get(tenant_id, job.id)

    async def get(self, tenant_id: str, job_id: str) -> JobView:
        async with self.db.transaction() as tx:
            job = await jobs_repo.get(tx, tenant_id, job_id)
        if job is None:
            raise NotFound(f"no forget job {job_id!r}")
        return view_of(job)

    async def wait(self, tenant_id: str, job_id: str, timeout_s: float) -> JobView:
        """The job once it ended, or as it stands when `timeout_s` ran out (any process may be running it)."""
        deadline = time.monotonic() + timeout_s
        while True:
            view = await self.get(tenant_id, job_id)
            if view.finished or time.monotonic() >= deadline:
                return view
            await asyncio.sleep(0.1)

    async def plan(
        self, tenant_id: str, target: Target, strategy: ForgetStrategy, session_ids: Sequence[str], reason: str | None
    ) -> JobView:
        """A dry run: per session τ, the closure with why each artifact is in it, the restore point and the expected
        cost against a full reset. Reads only (a query target's observation embeddings are computed and kept)."""
        entries = []
        for session_id in session_ids:
            async with self.db.transaction() as tx:
                session = await sessions_repo.get(tx, tenant_id, session_id)
                if session is None:
                    continue
                found = await self._locate(tx, session, target)
                if found is None:
                    continue
                rows, located, tainted = found
                _check_session(strategy, session)
                strategy.check(located)
                checkpoints = await sessions_repo.checkpoints(tx, tenant_id, session_id)
            retrieval = session.context_policy == "retrieval"
            restore = restore_point(checkpoints, rows, located.tau) if strategy.replays and not retrieval else None
            entries.append(_planned(session, rows, located, tainted, restore, strategy))
        memory = None
        if target.namespace is not None:
            memory = {"namespace": target.namespace, "key": target.key, "tombstone_version": None}
        return JobView(
            id=new_id("fgt"), status="succeeded", strategy=strategy.name, target=target.scrubbed(), sessions=entries,
            memory=memory, reason=reason, dry_run=True,
        )

    async def _sessions_for(self, tenant_id: str, target: Target) -> list[str] | None:
        """The sessions a target reaches (None: an artifact id that is not, or no longer, live)."""
        async with self.db.transaction() as tx:
            if target.artifact_id is not None:
                artifact = await artifacts_repo.find(tx, tenant_id, target.artifact_id)
                if artifact is None:
                    return None
                if target.session_id is not None and artifact.session_id != target.session_id:
                    raise NotFound(f"no artifact {target.artifact_id!r} in session {target.session_id!r}")
                return [artifact.session_id]
            if target.namespace is not None:
                assert target.key is not None
                check_namespace(target.namespace)
                check_key(target.key)
                return await artifacts_repo.sessions_with_memory(tx, tenant_id, target.namespace, target.key)
            assert target.session_id is not None
            if await sessions_repo.get(tx, tenant_id, target.session_id) is None:
                raise NotFound(f"no session {target.session_id!r}")
            return [target.session_id]

    async def _check(self, tenant_id: str, target: Target, strategy: ForgetStrategy, session_ids: list[str]) -> None:
        """Refuse, before queueing, what the strategy cannot do with this target (422), or what needs the model
        when it is not loaded (503)."""
        if strategy.replays and not self.slot.ready and session_ids:
            raise NotReady("the model is not loaded yet", headers={"Retry-After": "5"})
        if strategy.targets is not None and target.kind not in strategy.targets:
            raise InvalidRequest(f"{strategy.name} takes a {' or '.join(sorted(strategy.targets))} target")
        async with self.db.transaction() as tx:
            sessions = [await sessions_repo.get(tx, tenant_id, i) for i in session_ids]
            for session in sessions:
                if session is not None:
                    _check_session(strategy, session)
            if target.kind not in ("artifact", "text"):
                return
            session = sessions[0]
            if session is None:
                raise NotFound(f"no session {session_ids[0]!r}")
            rows = await artifacts_repo.list_all(tx, tenant_id, session.id)
        located = locate_in(target, rows)
        if located is not None:
            strategy.check(located)

    async def _enqueue(self, tenant_id: str, target: Target, strategy: ForgetStrategy, reason: str | None) -> str:
        if target.namespace is not None and strategy.forgets_memory:
            assert target.key is not None
            memory = MemoryService(self.db, cascade=JobCascade(strategy.name, reason))
            outcome = await memory.forget(tenant_id, target.namespace, target.key)
            if outcome.forget_id is not None:
                return outcome.forget_id
            receipt: dict[str, Any] = {
                "memory": {"namespace": target.namespace, "key": target.key, "tombstone_version": outcome.version}
            }
        else:
            receipt = {}
        async with self.db.transaction() as tx:
            return await self.enqueue_in(tx, tenant_id, target, strategy, reason, receipt)

    async def enqueue_in(
        self, tx: AsyncSession, tenant_id: str, target: Target, strategy: ForgetStrategy, reason: str | None,
        receipt: dict[str, Any] | None = None,
    ) -> str:
        """Queue a job in the caller's transaction (a webhook records its delivery in the same one)."""
        job = await jobs_repo.create(
            tx, id=new_id("fgt"), tenant_id=tenant_id, status="queued", strategy=strategy.name,
            target=target.to_dict(), reason=reason, receipt=receipt or {}, attempts=0,
        )
        return job.id

    async def validate(self, tenant_id: str, target: Target, strategy: ForgetStrategy) -> None:
        """What `submit` checks before queueing, for callers that queue themselves (404, 422, 503)."""
        session_ids = await self._sessions_for(tenant_id, target)
        if session_ids is None:
            raise NotFound(f"no artifact {target.artifact_id!r}")
        await self._check(tenant_id, target, strategy, session_ids)

    def notify(self) -> None:
        if self.wake is not None:
            self.wake.set()

    async def _locate(
        self, tx: AsyncSession, session: AgentSession, target: Target
    ) -> tuple[list[Artifact], Located, list[Tainted]] | None:
        matches: list[str] = []
        if target.query is not None:
            matches = await self._similar(tx, session.id, target.query, target.min_similarity)
        elif target.keyword is not None:
            kinds = [k for k in ROLE_OF if k not in ("system", "instruction")]
            matches = await artifacts_repo.keyword_matches(tx, session.id, target.keyword, kinds)
        rows = await artifacts_repo.list_all(tx, session.tenant_id, session.id)  # archived ones too: replay needs them
        located = locate_in(target, rows, matches)
        if located is None:
            return None
        edges = await artifacts_repo.edges_from_turn(tx, session.id, located.tau)
        return rows, located, closure(located.sources, edges, rows)

    async def _similar(
        self, tx: AsyncSession, session_id: str, query: str, min_similarity: float | None, *, outputs: bool = False
    ) -> list[str]:
        """pgvector similarity over the session's observations (model outputs too with `outputs`); embeddings are
        computed once, on demand."""
        excluded = [] if outputs else sorted(MODEL_KINDS)
        missing = await artifacts_repo.unembedded_observations(tx, session_id, excluded)
        vectors = await self.embedder.embed([a.content for a in missing] + [query])
        await artifacts_repo.set_embeddings(tx, {a.id: v for a, v in zip(missing, vectors, strict=False)})
        threshold = DEFAULT_MIN_SIMILARITY if min_similarity is None else min_similarity
        return await artifacts_repo.similar_observations(tx, session_id, vectors[-1], threshold, excluded)

    # -- execution (the worker calls this with a claimed job) ---------------------------------------------------

    async def execute(self, job: ForgetJob, owner: str) -> JobView:
        started = time.monotonic()
        target = Target.from_dict(job.target)
        strategy = STRATEGIES[job.strategy]
        receipt = dict(job.receipt or {})
        receipt.setdefault("sessions", [])
        receipt.setdefault("suppressed_side_effects", [])
        receipt.setdefault("committed_side_effects", [])
        try:
            session_ids = await self._sessions_for(job.tenant_id, target) or []
            done = {entry["session_id"] for entry in receipt["sessions"]}
            for session_id in session_ids:
                if session_id not in done:
                    await self._forget_session(job, owner, target, strategy, session_id, receipt)
        except (Retry, LeaseLost):
            raise
        except NeedsInput:
            return await self._park(job, owner, receipt, started)
        except Exception as exc:
            log.warning("forget job failed", extra={"forget_id": job.id, "error": type(exc).__name__})
            return await self._finish(job, owner, target, strategy, receipt, started, error=_describe(exc))
        return await self._finish(job, owner, target, strategy, receipt, started, error=None)

    async def _forget_session(
        self, job: ForgetJob, owner: str, target: Target, strategy: ForgetStrategy, session_id: str,
        receipt: dict[str, Any],
    ) -> None:
        if strategy.replays and not self.slot.ready:
            raise Retry("the model is not loaded yet")
        try:
            async with self.sessions.exclusive(job.tenant_id, session_id, self.lock_timeout_s) as (tx, session):
                found = await self._locate(tx, session, target)
                if found is None:
                    return  # not (or no longer) in this session: nothing to forget there
                rows, located, tainted = found
                _check_session(strategy, session)
                strategy.check(located)
                checkpoints = await sessions_repo.checkpoints(tx, job.tenant_id, session_id)
                similar: list[str] = []
                if strategy.matches_outputs and target.query is not None:
                    similar = await self._similar(tx, session.id, target.query, target.min_similarity, outputs=True)
                work = SessionWork(
                    tx, self.slot.engine, self.handles, session, rows, located, tainted, checkpoints, self.embedder,
                    provided=dict(receipt.get("inputs", {})), similar=similar,
                )
                change = await strategy.apply(work)
                # The receipt as it will be if this transaction commits (and only then).
                draft = copy.deepcopy(receipt)
                draft["sessions"].append(await _swap(tx, session, rows, located, tainted, change))
                if strategy.cleans_derived_memory:
                    derived = await self._forget_derived_memory(tx, job, tainted)
                    draft.setdefault("derived_memory", []).extend(derived)
                if strategy.flags_sources:
                    await sessions_repo.flag_sources(tx, session_id, located.sources)
                if isinstance(change, Rebuilt):
                    draft["suppressed_side_effects"].extend(_effects(session_id, change.suppressed))
                    draft["committed_side_effects"].extend(_effects(session_id, change.committed_dropped))
                if await jobs_repo.lock_owned(tx, job.id, owner) is None:
                    raise LeaseLost(job.id)
                await jobs_repo.save_receipt(tx, job.id, draft)
        except SessionBusy:
            raise Retry(f"session {session_id} is busy") from None
        except NeedsInput as wait:
            self.handles.pop(session_id)
            receipt["pending"] = {"session_id": wait.session_id, "tool_call": {
                "id": wait.call.id, "name": wait.call.name, "arguments": wait.call.arguments}}
            raise
        except NotFound:
            return  # the session was deleted meanwhile: nothing of it is left to forget
        except BaseException:
            # Nothing of this session's rebuild committed; the cache handle may hold the rebuilt suffix.
            self.handles.pop(session_id)
            raise
        receipt.clear()
        receipt.update(draft)
        self._observe_session(strategy.name, receipt["sessions"][-1])

    async def _forget_derived_memory(
        self, tx: AsyncSession, job: ForgetJob, tainted: list[Tainted]
    ) -> list[dict[str, Any]]:
        """Tombstone memory records a session wrote back from an artifact in the closure (a summary that had seen
        the target), in the session's transaction; each queues its own cascade job."""
        if not tainted:
            return []
        records = await memory_repo.derived_from(tx, job.tenant_id, [t.artifact_id for t in tainted])
        out = []
        for namespace, key in records:
            outcome, _ = await forget_in(
                tx, JobCascade("selective_replay", f"derived from what {job.id} forgot"), job.tenant_id, namespace,
                key, source="cascade",
            )
            out.append({"namespace": namespace, "key": key, "tombstone_version": outcome.version,
                        "forget_id": outcome.forget_id})
        return out

    async def _finish(
        self, job: ForgetJob, owner: str, target: Target, strategy: ForgetStrategy, receipt: dict[str, Any],
        started: float, *, error: str | None,
    ) -> JobView:
        status = "failed" if error is not None else "succeeded"
        receipt.pop("inputs", None)  # the client's answers now live in the sessions, or nowhere
        receipt.pop("pending", None)
        receipt["duration_ms"] = int((time.monotonic() - started) * 1000) + int(receipt.get("duration_ms") or 0)
        async with self.db.transaction() as tx:
            if await jobs_repo.lock_owned(tx, job.id, owner) is None:
                raise LeaseLost(job.id)
            await jobs_repo.finish(
                tx, job.id, status=status, target=target.scrubbed(), receipt=receipt, error=error,
                finished_at=datetime.now(UTC),
            )
            row = await jobs_repo.get(tx, job.tenant_id, job.id)
        assert row is not None
        self.metrics.forget_jobs.labels(strategy=strategy.name, status=status).inc()
        self.metrics.forget_duration.labels(strategy=strategy.name).observe(receipt["duration_ms"] / 1000)
        log.info(
            "forget job finished",
            extra={"forget_id": job.id, "strategy": strategy.name, "status": status,
                   "sessions": len(receipt["sessions"]), "duration_ms": receipt["duration_ms"]},
        )
        return view_of(row)

    async def give_up(self, job: ForgetJob, owner: str, why: str) -> JobView:
        """End a job that could not make progress in MAX_ATTEMPTS tries (its sessions stayed busy)."""
        target, strategy = Target.from_dict(job.target), STRATEGIES[job.strategy]
        receipt = dict(job.receipt or {})
        return await self._finish(job, owner, target, strategy, receipt, time.monotonic(), error=why)

    async def _park(self, job: ForgetJob, owner: str, receipt: dict[str, Any], started: float) -> JobView:
        """needs_input: the sessions done so far stay done (their entries are saved); the job waits for the
        client's answer to `receipt["pending"]`, then runs again (`provide`)."""
        receipt["duration_ms"] = int((time.monotonic() - started) * 1000) + int(receipt.get("duration_ms") or 0)
        async with self.db.transaction() as tx:
            if await jobs_repo.lock_owned(tx, job.id, owner) is None:
                raise LeaseLost(job.id)
            await jobs_repo.park(tx, job.id, receipt)
            row = await jobs_repo.get(tx, job.tenant_id, job.id)
        assert row is not None
        log.info("forget job needs input", extra={"forget_id": job.id})
        return view_of(row)

    async def provide(self, tenant_id: str, job_id: str, tool_call_id: str, content: str) -> JobView:
        """The client's result for the call a needs_input job waits on; the job is queued again."""
        async with self.db.transaction() as tx:
            job = await jobs_repo.get(tx, tenant_id, job_id, for_update=True)
            if job is None:
                raise NotFound(f"no forget job {job_id!r}")
            pending = (job.receipt or {}).get("pending")
            if job.status != "needs_input" or pending is None:
                raise Conflict(f"forget job {job_id!r} is {job.status}, not waiting for a tool result")
            if pending["tool_call"]["id"] != tool_call_id:
                raise InvalidRequest(f"the job waits for tool call {pending['tool_call']['id']!r}")
            receipt = dict(job.receipt)
            receipt["inputs"] = {**receipt.get("inputs", {}), tool_call_id: content}
            receipt.pop("pending", None)
            await jobs_repo.requeue_with(tx, job_id, receipt)
        self.notify()
        return await self.get(tenant_id, job_id)

    def _observe_session(self, strategy: str, entry: dict[str, Any]) -> None:
        tokens = entry["tokens"]
        self.metrics.forget_transitions.labels(strategy=strategy).observe(entry["transitions_replayed"])
        for kind in ("reused", "prefilled", "decoded"):
            self.metrics.forget_tokens.labels(strategy=strategy, kind=kind).inc(max(0, tokens[kind]))
        self.metrics.forget_full_reset.labels(strategy=strategy).inc(max(0, tokens["full_reset_estimate"]))


async def _swap(
    tx: AsyncSession, session: AgentSession, rows: list[Artifact], located: Located, tainted: list[Tainted],
    change: Rebuilt | Rewritten | None,
) -> dict[str, Any]:
    """Write a strategy's change in the session's transaction and return the session's receipt entry."""
    rows = [r for r in rows if r.archived_by is None]  # the live state (archived originals are history)
    before = state_sha256((r.kind, r.turn, r.token_ids) for r in rows)
    log_before = [t for r in sorted(rows, key=lambda r: r.position) for t in r.token_ids]  # read before any write
    entry = _entry(session, located, tainted)
    entry.update({
        "tokens": {"reused": 0, "prefilled": 0, "decoded": 0, "full_reset_estimate": 0},
        "epoch_after": session.epoch,
        "state_sha256_before": before,
        "state_sha256_after": before,
    })
    if change is None:
        entry["tokens"]["full_reset_estimate"] = compute_cost(session.token_count, replies_in(rows))
        return entry
    epoch = session.epoch + 1
    if isinstance(change, Rebuilt):
        await artifacts_repo.unarchive_from(tx, session.id, change.from_turn)  # its compactions are replayed
        await artifacts_repo.delete_from_turn(tx, session.id, change.from_turn)
        await sessions_repo.delete_checkpoints_from(tx, session.id, change.from_turn)
        await tools_repo.delete_environments_from(tx, session.id, change.from_turn)
        for turn, state in change.environments:
            await tools_repo.save_environment(tx, session.id, turn, state)
        await artifacts_repo.insert_artifacts(tx, change.rows)
        await artifacts_repo.insert_edges(tx, change.edges)
        for turn in {t for _, t in change.archive_existing}:
            await artifacts_repo.archive(tx, session.id, [i for i, t in change.archive_existing if t == turn], turn)
        await sessions_repo.add_checkpoints(
            tx, session.id, [(b.turn, b.token_offset, b.manifest_sha256) for b in change.checkpoints]
        )
        if session.tools:
            await tools_repo.link_checkpoints(tx, session.id, max(0, change.from_turn - 1))
        turns = max([session.turns, *(r["turn"] for r in change.rows)])
        await sessions_repo.record_forget(
            tx, session.id, epoch=epoch, turns=turns, token_count=change.token_count,
            system_prompt=change.system_prompt,
        )
        restore = change.restored_from
        entry["transitions_replayed"] = change.transitions
        if restore is not None and restore.turn >= 0:
            entry["checkpoint"] = {"turn": restore.turn, "token_offset": restore.token_offset}
        tokens = (change.reused, change.prefilled, change.decoded)
    else:
        await artifacts_repo.delete_ids(tx, session.id, change.deleted)  # their edges go with them
        await artifacts_repo.rewrite(tx, session.id, change.updated)
        await artifacts_repo.insert_artifacts(tx, change.inserted)
        await artifacts_repo.insert_edges(tx, change.edges)
        if change.first_turn is not None:
            # Manifests from the first edited transition on name spans that changed: those checkpoints are gone.
            await sessions_repo.delete_checkpoints_from(tx, session.id, change.first_turn)
        await sessions_repo.record_forget(
            tx, session.id, epoch=epoch, turns=session.turns, token_count=change.token_count,
            system_prompt=change.system_prompt,
        )
        entry["transitions_replayed"] = change.transitions
        tokens = (change.reused, change.prefilled, change.decoded)
    after = await artifacts_repo.list_live(tx, session.tenant_id, session.id)
    log_after = [t for r in after for t in r.token_ids]
    if rotates(log_before, log_after, retrieval=session.context_policy == "retrieval"):
        # The forgotten blocks stay in vLLM's prefix cache until evicted: no request of this session may reach them.
        await sessions_repo.bump_cache_generation(tx, session.id)
    entry["epoch_after"] = epoch
    entry["state_sha256_after"] = state_sha256((r.kind, r.turn, r.token_ids) for r in after)
    entry["tokens"] = {
        "reused": tokens[0],
        "prefilled": tokens[1],
        "decoded": tokens[2],
        "full_reset_estimate": compute_cost(after[-1].token_end if after else 0, replies_in(after)),
    }
    return entry


def _entry(session: AgentSession, located: Located, tainted: list[Tainted]) -> dict[str, Any]:
    """What a receipt entry and a plan entry share: where the target sits in the session and what it tainted."""
    return {
        "session_id": session.id,
        "tau": located.tau,
        "T": session.turns,
        "transitions_replayed": 0,
        "checkpoint": None,
        "closure": [t.artifact_id for t in tainted],
        "epoch_before": session.epoch,
    }


def _planned(
    session: AgentSession, rows: list[Artifact], located: Located, tainted: list[Tainted], restore: Restore | None,
    strategy: ForgetStrategy,
) -> dict[str, Any]:
    rows = [r for r in rows if r.archived_by is None]
    full = compute_cost(session.token_count, replies_in(rows))
    entry = _entry(session, located, tainted)
    entry["trace"] = [{"artifact_id": t.artifact_id, "kind": t.kind, "turn": t.turn, "why": t.why} for t in tainted]
    entry["tokens"] = {"reused": 0, "recompute_estimate": 0, "full_reset_estimate": full}
    if session.context_policy == "retrieval" and strategy.replays:
        # Outputs are regenerated one by one (regenerate.py), not a suffix replayed: the estimate is Dep(M)'s outputs.
        sources = set(located.sources)
        redo = [r for r in rows if r.kind in MODEL_KINDS and r.id in entry["closure"] and r.id not in sources]
        if strategy.name == "full_reset":
            redo = [r for r in rows if r.kind in MODEL_KINDS]
        entry["transitions_replayed"] = len(redo)
        entry["tokens"]["recompute_estimate"] = sum(len(r.token_ids) for r in redo)
    if restore is not None:
        after = [r for r in rows if r.token_start >= restore.token_offset]
        entry["transitions_replayed"] = session.turns - restore.turn
        if restore.turn >= 0:
            entry["checkpoint"] = {"turn": restore.turn, "token_offset": restore.token_offset}
        entry["tokens"]["reused"] = restore.token_offset
        # What the contaminated suffix cost; the rebuilt one is about as long, less the target.
        entry["tokens"]["recompute_estimate"] = compute_cost(
            session.token_count - restore.token_offset, replies_in(after)
        )
    return entry


def _check_session(strategy: ForgetStrategy, session: AgentSession) -> None:
    """422 for a strategy that cannot forget in this kind of session."""
    if session.context_policy not in strategy.policies:
        raise InvalidRequest(
            f"{strategy.name} cannot forget in a session with context_policy {session.context_policy!r}"
        )


def _effects(session_id: str, calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    """Side effects for a receipt: which call of which session, never its arguments (they may hold the target)."""
    return [{"session_id": session_id, "tool_call_id": c.id, "name": c.name} for c in calls]


def _describe(exc: BaseException) -> str:
    """A job's error for its receipt: the error's type and message, which never carry artifact text (the runtime's
    messages are about tokens, ids and limits)."""
    message = str(exc).strip()
    if isinstance(exc, InvalidRequest | NotFound):
        return message[:500]
    return f"{type(exc).__name__}: {message}"[:500]
