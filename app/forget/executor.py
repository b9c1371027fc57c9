"""Running a claimed forget job (the worker calls `execute`): each session forgotten under its lease, atomically.

A job's engine work runs at its priority (app/engine/priority.py): above every live turn, a detector webhook's job
above any other forget, so a forget beside many generating sessions does not queue behind their replies.

Each session is forgotten under that session's lease (status `forgetting`, app/sessions/locking.py): the target is
located in a short read, the strategy computes the rebuilt state aside (in memory, no transaction open), then one
transaction that checks the lease is still the job's swaps the old state out, bumps the epoch and saves the session's
receipt entry. A crash before the commit leaves the session as it was and the job claimable again once its lease
expires; a crash after it leaves a receipt entry that the retry skips. So a forget is atomic per session, durable,
and idempotent.

The target's text is needed while the job runs (and must survive a crash), so it is stored with the job, sealed under
the job's own leaf (app/forget/repositories/sealing.py); when the job ends that leaf joins the job's shred set, the
ciphertexts are dropped and the clear target keeps only ids and lengths. Receipts hold artifact ids, counts and
digests, never a copy of the text.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.database import Database
from app.db.models import ForgetJob
from app.db.statements import InSession
from app.embeddings import Embedder
from app.engine.priority import Priority, engine_priority, measure_wait
from app.engine.session_caches import SessionCaches
from app.engine.slot import EngineSlot
from app.errors import EngineUnavailable, InvalidRequest, NotFound, SessionBusy
from app.forget import locate
from app.forget.cascade import JobCascade
from app.forget.closure import ClosureEntry
from app.forget.cost import Yardstick
from app.forget.jobs import DEFAULT_HORIZON_S, Held, JobView, LeaseLost, Retry, Runner, ShredWait, view_of
from app.forget.locate import Target
from app.forget.per_policy import ForgetLookup
from app.forget.receipts import DerivedMemory, JobReceipt, PendingInput, SessionEntry, side_effects
from app.forget.replay import NeedsInput, Rebuilt
from app.forget.repositories import held as held_repo
from app.forget.repositories import jobs as jobs_repo
from app.forget.repositories.sealing import clear_target
from app.forget.session_work import SessionWork
from app.forget.shredding import Shredder
from app.forget.state_swap import swap_in
from app.forget.strategies import STRATEGIES, ForgetStrategy
from app.forget.target_sessions import check_session, sessions_reached
from app.holds import repository as holds_repo
from app.holds.guard import session_hold
from app.keys.content import Sealer
from app.keys.errors import Tampered, Unavailable
from app.memory.in_transaction import forget_in
from app.memory.repositories import records as memory_repo
from app.observability.metrics import Metrics
from app.runtime.routing import session_route
from app.runtime.transition import Machinery
from app.sessions.repositories import sessions as sessions_repo
from app.sessions.repositories.artifacts import Retired
from app.sessions.service import SessionService

log = logging.getLogger(__name__)


class ForgetExecutor:
    def __init__(
        self, db: Database, engine: EngineSlot, handles: SessionCaches, sessions: SessionService, metrics: Metrics,
        embedder: Embedder, policies: ForgetLookup, *, sealer: Sealer, lock_timeout_s: float = 120.0,
        replay_verify: bool = True, horizon_s: int = DEFAULT_HORIZON_S, shredder: Shredder | None = None,
    ) -> None:
        self.db = db
        self.sealer = sealer  # the process's: the job's and the sessions' content is sealed and opened with it
        self.slot = engine
        self.handles = handles
        self.sessions = sessions
        self.metrics = metrics
        self.embedder = embedder
        self.policies = policies
        self.lock_timeout_s = lock_timeout_s
        self.replay_verify = replay_verify  # LETHE_REPLAY_VERIFY: replays verify recorded replies (engine/verify.py)
        self.horizon_s = horizon_s  # promised on receipts, and recorded on the cascade jobs of derived records
        # Shreds the leaves of the artifacts a job erased once its last swap committed (None: the worker's sweep).
        self.shredder = shredder
        # Jobs of other domains, by strategy (a data subject's erasure: app/subjects/erasure.py), wired by the
        # composition root: run by this worker, ended here like any other.
        self.runners: dict[str, Runner] = {}

    async def execute(self, job: ForgetJob, owner: str) -> JobView:
        started = time.monotonic()
        try:
            async with self.db.transaction() as tx:
                await jobs_repo.opened(tx, self.sealer, job)
        except Unavailable:
            raise Retry("the key provider is unavailable") from None
        except Tampered:  # a ciphertext moved from another row, or a damaged cover: loud, and the queue goes on
            log.error("forget job target does not open: tampered", extra={"forget_id": job.id})
            return await self.give_up(job, owner, "its target does not open (Tampered): it was not sealed for this job")
        if job.target_erased:  # its leaf was shredded before it ended (a backup restored from after its end)
            return await self.give_up(job, owner, "its target was erased at rest before the job ended; submit again")
        if (runner := self.runners.get(job.strategy)) is not None:
            return await self._run(job, owner, runner, started)
        target = Target.from_dict(job.target)
        strategy = STRATEGIES.named(job.strategy)
        receipt = JobReceipt.load(job.receipt)
        held: Held | None = None
        try:
            async with self.db.transaction() as tx:
                session_ids = await sessions_reached(tx, self.sealer, job.tenant_id, target) or []
            for session_id in session_ids:
                if not receipt.done(session_id):
                    try:
                        receipt = await self._forget_session(job, owner, target, strategy, session_id, receipt)
                    except Held as waits:  # the others go on; the job then waits on (the first) hold
                        held = held or waits
        except (Retry, LeaseLost):
            raise
        except NeedsInput as wait:
            call = {"id": wait.call.id, "name": wait.call.name, "arguments": wait.call.arguments}
            pending = PendingInput(session_id=wait.session_id, tool_call=call)
            return await self._park(job, owner, receipt.model_copy(update={"pending": pending}), started)
        except Exception as exc:
            # With the traceback: the runtime's messages name tokens, ids and limits, never artifact text.
            log.warning("forget job failed", extra={"forget_id": job.id, "error": type(exc).__name__}, exc_info=True)
            return await self._finish(job, owner, strategy.name, receipt, started, error=_describe(exc))
        if held is not None:
            return await self._hold(job, owner, receipt, held, started)
        return await self._finish(job, owner, strategy.name, receipt, started, error=None)

    async def _run(self, job: ForgetJob, owner: str, runner: Runner, started: float) -> JobView:
        """A job of another domain's (`runners`): its work, then the same end as a session forget's (its leaves and
        the job's own shredded, `"shred": "now"` honoured, the target's words dropped)."""
        try:
            outcome = await runner(job)
        except Held as waits:
            return await self._hold(job, owner, JobReceipt.load(job.receipt), waits, started)
        except (Retry, LeaseLost):
            raise
        except Exception as exc:
            log.warning("forget job failed", extra={"forget_id": job.id, "error": type(exc).__name__}, exc_info=True)
            return await self._finish(job, owner, job.strategy, JobReceipt.load(job.receipt), started,
                                      error=_describe(exc))
        async with self.db.transaction() as tx:
            if await jobs_repo.lock_owned(tx, job.id, owner) is None:
                raise LeaseLost(job.id)
            await jobs_repo.add_shred_leaves(tx, job.id, outcome.leaves)
        return await self._finish(job, owner, job.strategy, outcome.receipt, started, error=None)

    async def _forget_session(
        self, job: ForgetJob, owner: str, target: Target, strategy: ForgetStrategy, session_id: str,
        receipt: JobReceipt,
    ) -> JobReceipt:
        """The receipt with this session's entry, as committed with the session's swap (unchanged when the target is
        not, or no longer, in the session)."""
        if strategy.replays and not await self.slot.available():
            raise Retry("the model is not loaded yet")
        async with self.db.transaction() as tx:  # before any model work (the swap's transaction checks again)
            if (standing := await session_hold(InSession(tx), job.tenant_id, session_id, lock=False)) is not None:
                raise Held(standing.id, {"session_id": session_id})
        outputs = strategy.matches_outputs
        vector = None
        if target.query is not None:  # embedded before the lock: under it only the SQL similarity query runs
            vector = await locate.embed_query(
                self.db, self.sealer, self.embedder, session_id, target.query, outputs=outputs
            )
        try:
            async with self.sessions.leased(job.tenant_id, session_id, "forgetting", self.lock_timeout_s) as lease:
                session = lease.row
                async with lease.reads() as tx:
                    if vector is not None and await locate.unembedded(tx, self.sealer, session_id, outputs=outputs):
                        raise Retry(f"session {session_id} has new observations to embed")
                    found = await locate.find(tx, self.sealer, session, target, vector)
                    if found is None:
                        return receipt  # not (or no longer) in this session: nothing to forget there
                    check_session(strategy, session, self.policies)
                    strategy.check(found.located)
                    similar: list[str] = []
                    if outputs and vector is not None:
                        similar = await locate.similar(
                            tx, self.sealer, session.id, vector, target.min_similarity, outputs=True
                        )
                    checkpoints = await sessions_repo.checkpoints(tx, job.tenant_id, session_id)
                policy = self.policies.of(session)
                machinery = Machinery(
                    self.slot.engine, self.handles, self.embedder, self.db, self.sealer, self.replay_verify
                )
                work = SessionWork(
                    machinery, policy, session, found.rows, found.located, found.closure, checkpoints,
                    provided=dict(receipt.provided), similar=similar,
                )
                # The model work, outside any transaction, at the job's priority: ahead of other sessions' turns.
                level = Priority(job.priority)
                with engine_priority(level), measure_wait() as waited:
                    change = await strategy.apply(work, policy.forget)
                if waited.calls:  # an engine that measures its queue (hf, in-process vllm; a fleet does not)
                    self.metrics.forget_engine_wait.labels(priority=level.label).observe(waited.seconds)
                async with lease.commit() as (tx, locked):
                    # Ordered against a hold being placed (app/holds/repository.py): this shared lock, or its
                    # exclusive one, first. A job queued before the hold, or a memory key's cascade, waits on it.
                    if (standing := await session_hold(InSession(tx), job.tenant_id, session_id)) is not None:
                        raise Held(standing.id, {"session_id": session_id})
                    entry, retired = await swap_in(
                        tx, self.sealer, locked, found, change, policy.forget, Yardstick.of(self.slot.engine)
                    )
                    entry = entry.model_copy(update={"exactness": self.slot.engine.exactness})
                    derived = []
                    if strategy.cleans_derived_memory:
                        derived = await self._forget_derived_memory(tx, job, found.closure)
                    if strategy.flags_sources:
                        await sessions_repo.flag_sources(tx, session_id, found.located.sources)
                    rebuilt = change if isinstance(change, Rebuilt) else Rebuilt(from_turn=0)  # no calls: none
                    # The receipt as it will be if this transaction commits (and only then).
                    updated = receipt.model_copy(update={
                        "sessions": [*receipt.sessions, entry],
                        "derived_memory": [*receipt.derived_memory, *derived],
                        "suppressed_side_effects": [
                            *receipt.suppressed_side_effects, *side_effects(session_id, rebuilt.suppressed)
                        ],
                        "committed_side_effects": [
                            *receipt.committed_side_effects, *side_effects(session_id, rebuilt.committed_dropped)
                        ],
                        "erasure_horizon_s": _promise(receipt, retired, self.horizon_s),
                    })
                    if (owned := await jobs_repo.lock_owned(tx, job.id, owner)) is None:
                        raise LeaseLost(job.id)
                    await jobs_repo.save_receipt(tx, self.sealer, owned, updated.stored())
                    # With the swap: a copy of the session taken after this commit holds only ciphertext under them.
                    await jobs_repo.add_shred_leaves(tx, job.id, retired.leaves)
        except SessionBusy:
            raise Retry(f"session {session_id} is busy") from None
        except NeedsInput:
            await self.handles.drop(session_route(job.tenant_id, session_id))
            raise
        except NotFound:
            return receipt  # the session was deleted meanwhile: nothing of it is left to forget
        except EngineUnavailable as gone:
            # The engine went away under the replay (its process restarts, a fleet server died): nothing of this
            # session committed, and the job runs again on an engine that lives (the restarted process, the router's
            # next worker) instead of failing.
            await self.handles.drop(session_route(job.tenant_id, session_id))
            raise Retry(f"session {session_id}: {gone.detail}") from None
        except BaseException:
            # Nothing of this session's rebuild committed; the cache handle may hold the rebuilt suffix.
            await self.handles.drop(session_route(job.tenant_id, session_id))
            raise
        self._observe_session(strategy.name, entry)
        return updated

    async def _forget_derived_memory(
        self, tx: AsyncSession, job: ForgetJob, closure: list[ClosureEntry]
    ) -> list[DerivedMemory]:
        """Tombstone memory records a session wrote back from an artifact in the closure (a summary that had seen
        the target), in the session's transaction; each queues its own cascade job."""
        if not closure:
            return []
        records = await memory_repo.derived_from(InSession(tx), job.tenant_id, [entry.artifact_id for entry in closure])
        out = []
        for namespace, key in records:
            # No shredder: this transaction commits later, with the session; the forget worker's sweep shreds then.
            cascade = JobCascade(
                "selective_replay", f"derived from what {job.id} forgot", sealer=self.sealer,
                on_finished=self._finished_at_once, horizon_s=self.horizon_s,
            )
            outcome, _ = await forget_in(InSession(tx), cascade, job.tenant_id, namespace, key, source="cascade")
            out.append(DerivedMemory(
                namespace=namespace, key=key, tombstone_version=outcome.version, forget_id=outcome.forget_id
            ))
        return out

    def _finished_at_once(self, strategy: str) -> None:
        self.metrics.job_finished(strategy, "succeeded", 0)

    async def _finish(
        self, job: ForgetJob, owner: str, strategy: str, receipt: JobReceipt, started: float, *, error: str | None,
    ) -> JobView:
        status = "failed" if error is not None else "succeeded"
        # Its target, reason and sealed receipt end with it: their leaf is shredded with the job's others.
        async with self.db.transaction() as tx:
            if (owned := await jobs_repo.lock_owned(tx, job.id, owner)) is None:
                raise LeaseLost(job.id)
            if owned.leaf is not None and owned.leaf not in (owned.shred_leaves or []):  # once: its end may rerun
                await jobs_repo.add_shred_leaves(tx, job.id, [owned.leaf])
        if not await self._shred(job) and job.shred_now and error is None and self.shredder is not None:
            # `"shred": "now"`: it reads as ended only once its keys are destroyed; until then it stays running and
            # its end runs again (the target and receipt it needs are still sealed under its leaf).
            raise ShredWait(f"job {job.id}: the key provider refused its shred")
        final = receipt.model_copy(update={
            "provided": {},  # the client's answers now live in the sessions, or nowhere
            "pending": None,
            "duration_ms": _elapsed_ms(started, receipt),
        })
        # forget=True: with strict forgets the job reads as finished only once the synchronous standbys applied this
        # commit, and with it every swap of the job committed before it (WAL is replayed in order).
        async with self.db.transaction(forget=True) as tx:
            if await jobs_repo.lock_owned(tx, job.id, owner) is None:
                raise LeaseLost(job.id)
            await jobs_repo.finish(
                tx, job.id, status=status, target=clear_target(job.target), receipt=final.stored(), error=error,
                finished_at=datetime.now(UTC),
            )
            row = await jobs_repo.get(tx, self.sealer, job.tenant_id, job.id)
        assert row is not None
        duration_ms = final.duration_ms or 0
        self.metrics.job_finished(strategy, status, duration_ms)
        log.info(
            "forget job finished",
            extra={"forget_id": job.id, "strategy": strategy, "status": status,
                   "sessions": len(final.sessions), "duration_ms": duration_ms},
        )
        return view_of(row)

    async def _shred(self, job: ForgetJob) -> bool:
        """Settle the leaves the job's swaps recorded (each committed with its swap) before the job reads as ended,
        so that it ends `at_rest: complete`; with the provider down the shred stays pending for the worker's sweep
        (False)."""
        if self.shredder is None:
            return False
        async with self.db.transaction() as tx:
            row = await jobs_repo.get(tx, self.sealer, job.tenant_id, job.id)
        if row is not None and row.shred_leaves and row.shredded_at is None:
            return await self.shredder.settle(row.tenant_id, row.id, list(row.shred_leaves))
        return True

    async def give_up(self, job: ForgetJob, owner: str, why: str) -> JobView:
        """End a job that could not make progress in MAX_ATTEMPTS tries (its sessions stayed busy)."""
        receipt = JobReceipt.load(job.receipt)
        return await self._finish(job, owner, job.strategy, receipt, time.monotonic(), error=why)

    async def _park(self, job: ForgetJob, owner: str, receipt: JobReceipt, started: float) -> JobView:
        """needs_input: the sessions done so far stay done (their entries are saved); the job waits for the
        client's answer to `receipt.pending`, then runs again (ForgetService.provide)."""
        parked = receipt.model_copy(update={"duration_ms": _elapsed_ms(started, receipt)})
        async with self.db.transaction() as tx:
            if (owned := await jobs_repo.lock_owned(tx, job.id, owner)) is None:
                raise LeaseLost(job.id)
            await jobs_repo.park(tx, self.sealer, owned, parked.stored())
            row = await jobs_repo.get(tx, self.sealer, job.tenant_id, job.id)
        assert row is not None
        log.info("forget job needs input", extra={"forget_id": job.id})
        return view_of(row)

    async def _hold(self, job: ForgetJob, owner: str, receipt: JobReceipt, held: Held, started: float) -> JobView:
        """held: the sessions done so far stay done; the job waits on the hold, which records it (event `deferred`)
        and queues it again on its release."""
        waiting = receipt.model_copy(update={"duration_ms": _elapsed_ms(started, receipt)})
        async with self.db.transaction() as tx:
            if (owned := await jobs_repo.lock_owned(tx, job.id, owner)) is None:
                raise LeaseLost(job.id)
            # The hold's row, locked: its release (which takes it too) either comes after and queues this job again,
            # or came before, and the job runs again now instead of waiting on a hold nobody will release.
            standing = await holds_repo.get(InSession(tx), job.tenant_id, held.hold_id, for_update=True)
            if standing is None or standing.released_at is not None:
                raise Retry(f"hold {held.hold_id} was released meanwhile")
            await held_repo.hold(tx, self.sealer, owned, waiting.stored(), held.hold_id)
            await holds_repo.event(InSession(tx), job.tenant_id, held.hold_id, "deferred", None,
                                   {"forget_id": job.id, **held.scope})
            row = await jobs_repo.get(tx, self.sealer, job.tenant_id, job.id)
        assert row is not None
        log.info("forget job held", extra={"forget_id": job.id, "hold_id": held.hold_id})
        return view_of(row)

    def _observe_session(self, strategy: str, entry: SessionEntry) -> None:
        tokens = entry.tokens
        self.metrics.forget_transitions.labels(strategy=strategy).observe(entry.transitions_replayed)
        counts = (
            ("reused", tokens.reused), ("prefilled", tokens.prefilled), ("decoded", tokens.decoded),
            ("verified", tokens.verified),
        )
        for kind, count in counts:
            self.metrics.forget_tokens.labels(strategy=strategy, kind=kind).inc(max(0, count or 0))
        self.metrics.forget_full_reset.labels(strategy=strategy).inc(max(0, tokens.full_reset_estimate))


def _promise(receipt: JobReceipt, retired: Retired, horizon_s: int) -> int | None:
    """The horizon the receipt promises at rest after one more session's swap: none once any swap of the job erased
    plaintext from before migration 0017 (its copies stay on disk whatever is shredded); a memory cascade job keeps
    what its tombstone promised."""
    if retired.plaintext:
        return None
    first = not receipt.sessions and receipt.memory is None
    return horizon_s if first else receipt.erasure_horizon_s


def _elapsed_ms(started: float, receipt: JobReceipt) -> int:
    """This attempt's time plus the earlier attempts' (a job parked for input runs again)."""
    return int((time.monotonic() - started) * 1000) + (receipt.duration_ms or 0)


def _describe(exc: BaseException) -> str:
    """A job's error for its receipt: the error's type and message, which never carry artifact text (the runtime's
    messages are about tokens, ids and limits)."""
    message = str(exc).strip()
    if isinstance(exc, InvalidRequest | NotFound):
        return message[:500]
    return f"{type(exc).__name__}: {message}"[:500]
