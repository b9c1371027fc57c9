"""A data subject's erasure (GDPR Art. 17): everything the person owns, erased through the machinery every forget
uses, with one receipt.

Each of their sessions is deleted whole (`SessionService.delete`: the session, its artifacts, checkpoints,
environments and conversation, every leaf shredded through its own finished job), and every live key of their
namespaces is tombstoned (`MemoryService.forget`: the tombstone's ordering against writes, the cascade into the
sessions a value was injected into, its leaf shredded). The erasure's own job, recorded finished, names all of it by
id and count and records every leaf those erased, so its `erasure` says when all of it is unrecoverable at rest
(shredding a leaf again is a no-op). The subject row keeps only its id, the time and that job's id.

With `also.text`, what they said inside other subjects' sessions (a shared support session) is forgotten there by
selective replay: every other session of the tenant is searched (sealed content is searched in the process, a page
at a time), and each one holding a text gets a text forget, queued; the receipt names the session and the job,
never the text (the job's own target is sealed and erased when it ends).

With `also.query`, the same by meaning: the query is embedded once, and every other session of the tenant whose
observations (everything but the model's outputs, as a forget's query target has it; those without a vector are
embedded first, sealed as any) hold one at least `min_similarity` similar to it (default 0.5, `DEFAULT_MIN_SIMILARITY`)
gets a query forget, queued: the forget worker drops every observation that similar by selective replay. The receipt
names the session and the job, never the query.

Legal holds (app/holds/): a hold on the subject refuses the whole erasure (409 `legal_hold`); a hold on one of
their sessions or namespaces (or on another subject's session `also` reaches) skips that part, which the receipt's
`held` names with the hold, and the erasure is recorded as deferred on the hold: releasing it runs the erasure again.
The plan (dry run) names the held parts the same way.

`submit` queues it as one forget job (strategy `subject_erase`, its `also` sealed with it), which the forget worker
runs (`run`, wired into `ForgetExecutor.runners`) and ends like any other: its leaves and its own shredded, its
words dropped, its receipt in `GET /v1/forget/{id}`. The request waits for it up to LETHE_FORGET_WAIT_S (`wait`,
the default), then answers 202 with the job still running; a person with thousands of sessions never holds a
request open. A hold placed on the whole subject after it was queued parks it (`held`) until released. It erases
one object at a time: a session or key the person gets while it runs is not in it (erase again). A worker that dies
part-way leaves the job to another, which erases what is left (what is gone is not counted again).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.db.database import Database
from app.db.models import ForgetJob
from app.db.statements import InSession
from app.embeddings import Embedder
from app.errors import LegalHold, NotFound
from app.forget import locate
from app.forget.jobs import Held, JobView, Outcome, Submission
from app.forget.receipts import JobReceipt, SubjectEntry
from app.forget.repositories import jobs as jobs_repo
from app.forget.service import ForgetService
from app.forget.shredding import Shredder
from app.holds import repository as holds_repo
from app.holds.guard import namespace_hold, refuse_subject, session_hold
from app.ids import new_id
from app.keys.content import Sealer
from app.memory.service import MemoryService
from app.observability.metrics import Metrics
from app.sessions.service import SessionService
from app.subjects import repository as repo
from app.subjects.schemas import SubjectErasePlan

STRATEGY = "subject_erase"
PAGE = 200
OBSERVED = ("user", "document", "tool_result")  # what a person says or gives a session: what `also` searches


@dataclass
class Plan:
    """What an erasure would erase now (a dry run answers it, and the erasure works through it)."""

    subject_id: str
    sessions: list[str] = field(default_factory=list)
    conversation_of: dict[str, str] = field(default_factory=dict)  # session → the OpenAI conversation it is
    namespaces: list[str] = field(default_factory=list)
    memory_keys: dict[str, list[str]] = field(default_factory=dict)  # namespace → live keys
    also: dict[str, list[str]] = field(default_factory=dict)  # another's session → the texts of `also` it holds
    also_query: list[str] = field(default_factory=list)  # another's session with an observation like `also.query`
    held: list[dict[str, str]] = field(default_factory=list)  # {hold_id, session_id | namespace}: skipped

    @property
    def conversations(self) -> list[str]:
        return [self.conversation_of[s] for s in self.sessions if s in self.conversation_of]

    def out(self) -> SubjectErasePlan:
        """What a dry run answers (the HTTP route and the MCP tool)."""
        return SubjectErasePlan(subject_id=self.subject_id, sessions=self.sessions, conversations=self.conversations,
                                namespaces=self.namespaces, memory_keys=sum(map(len, self.memory_keys.values())),
                                also=self.also_sessions, held=self.held)

    @property
    def also_sessions(self) -> list[str]:
        """Other subjects' sessions `also` reaches, by text or by query, each once."""
        return list(dict.fromkeys([*self.also, *self.also_query]))


class SubjectErasure:
    def __init__(self, db: Database, sealer: Sealer, sessions: SessionService, memory: MemoryService,
                 forget: ForgetService, shredder: Shredder, embedder: Embedder, *, horizon_s: int,
                 metrics: Metrics | None = None) -> None:
        self.db = db
        self.embedder = embedder  # embeds `also.query` once, and other sessions' observations that have no vector
        self.sealer = sealer
        self.sessions = sessions
        self.memory = memory
        self.forget = forget
        self.shredder = shredder
        self.horizon_s = horizon_s
        self.metrics = metrics

    async def plan(self, tenant_id: str, subject_id: str, also: Sequence[str] = (), *, query: str | None = None,
                   min_similarity: float | None = None) -> Plan:
        """`also`: texts, and `query` (with its `min_similarity`, default DEFAULT_MIN_SIMILARITY): what `also` of
        the request gives."""
        async with self.db.transaction() as tx:
            subject = await repo.get(tx, tenant_id, subject_id)
        if subject is None:
            raise NotFound(f"no subject {subject_id!r}")
        plan = Plan(subject_id, namespaces=list(subject.memory_namespaces))
        after = ""
        while True:
            async with self.db.transaction() as tx:
                page = await repo.sessions_after(tx, tenant_id, subject_id, after, PAGE)
            plan.sessions += [s.id for s in page]
            plan.conversation_of |= {s.id: s.conversation_id for s in page if s.conversation_id is not None}
            if len(page) < PAGE:
                break
            after = page[-1].id
        for namespace in plan.namespaces:
            keys: list[str] = []
            while True:
                async with self.db.transaction() as tx:
                    page_keys = await repo.live_keys_after(tx, tenant_id, namespace, keys[-1] if keys else "", PAGE)
                keys += page_keys
                if len(page_keys) < PAGE:
                    break
            plan.memory_keys[namespace] = keys
        if also:
            plan.also = await self._holding(tenant_id, subject_id, also)
        if query is not None:
            plan.also_query = await self._similar(tenant_id, subject_id, query, min_similarity)
        await self._skip_held(tenant_id, plan)
        return plan

    async def _skip_held(self, tenant_id: str, plan: Plan) -> None:
        """Move what a standing hold covers out of the plan into `held` (read only: the erasure itself checks
        again inside each deleting transaction, so a hold placed after this read still stops it)."""
        async with self.db.transaction() as tx:
            sql = InSession(tx)
            for session_id in [*plan.sessions, *plan.also_sessions]:
                held = await session_hold(sql, tenant_id, session_id, lock=False)
                if held is not None:
                    plan.held.append({"hold_id": held.id, "session_id": session_id})
            for namespace in plan.namespaces:
                held = await namespace_hold(sql, tenant_id, namespace, lock=False)
                if held is not None:
                    plan.held.append({"hold_id": held.id, "namespace": namespace})
        skipped = {h.get("session_id") for h in plan.held} | {h.get("namespace") for h in plan.held}
        plan.sessions = [s for s in plan.sessions if s not in skipped]
        plan.also = {s: t for s, t in plan.also.items() if s not in skipped}
        plan.also_query = [s for s in plan.also_query if s not in skipped]
        plan.memory_keys = {n: k for n, k in plan.memory_keys.items() if n not in skipped}

    async def _holding(self, tenant_id: str, subject_id: str, texts: Sequence[str]) -> dict[str, list[str]]:
        """Other subjects' sessions whose observations (what a person said or gave) hold one of `texts`, opened a
        page at a time: the whole tenant is read, as a search of sealed content must be."""
        found: dict[str, list[str]] = {}
        after = ""
        while True:
            async with self.db.transaction() as tx:
                page = await repo.others_after(tx, tenant_id, subject_id, after, PAGE)
            for session_id in page:
                position = -1
                while True:
                    async with self.db.transaction() as tx:
                        rows = await repo.artifacts_after(tx, self.sealer, tenant_id, session_id, position, PAGE)
                    for row in rows:
                        if row.kind in OBSERVED and not row.erased:
                            held = [t for t in texts if t in (row.content or "") and t not in found.get(session_id, [])]
                            if held:
                                found.setdefault(session_id, []).extend(held)
                    if len(rows) < PAGE:
                        break
                    position = rows[-1].position
            if len(page) < PAGE:
                return found
            after = page[-1]

    async def _similar(self, tenant_id: str, subject_id: str, query: str, min_similarity: float | None) -> list[str]:
        """Other subjects' sessions with an observation at least `min_similarity` similar to `query`, which is
        embedded once; each session's observations without a vector are embedded first (in their own short
        transactions, as a forget's query target has them), and the whole tenant is read."""
        [vector] = await self.embedder.embed([query])
        found: list[str] = []
        after = ""
        while True:
            async with self.db.transaction() as tx:
                page = await repo.others_after(tx, tenant_id, subject_id, after, PAGE)
            for session_id in page:
                await locate.embed_observations(self.db, self.sealer, self.embedder, session_id)
                async with self.db.transaction() as tx:
                    if await locate.similar(tx, self.sealer, session_id, vector, min_similarity):
                        found.append(session_id)
            if len(page) < PAGE:
                return found
            after = page[-1]

    async def submit(self, tenant_id: str, subject_id: str, also: Sequence[str] = (), *, query: str | None = None,
                     min_similarity: float | None = None, wait: bool = True) -> JobView:
        """Queue the erasure as one forget job the forget worker runs (`run`); with `wait`, answer it once ended or
        as it stands after the forget wait (LETHE_FORGET_WAIT_S). A hold on the whole subject refuses it (409)."""
        async with self.db.transaction() as tx:
            # Refused now if held now; a hold placed before the worker runs it parks the job (`run` checks, locked).
            await refuse_subject(InSession(tx), tenant_id, subject_id, lock=False)
            if await repo.get(tx, tenant_id, subject_id) is None:
                raise NotFound(f"no subject {subject_id!r}")
        target: dict[str, Any] = {"subject_id": subject_id}
        if also:  # sealed with the job (its words are what to forget), dropped when it ends
            target["text"] = list(also)
        if query is not None:
            target |= {"query": query, "min_similarity": min_similarity}
        job_id = new_id("fgt")
        async with self.db.transaction() as tx:
            await jobs_repo.queue(InSession(tx), self.sealer, id=job_id, tenant_id=tenant_id, strategy=STRATEGY,
                                  target=target, reason=None, receipt={})
        self.forget.notify()
        if wait:
            return await self.forget.wait(tenant_id, job_id, self.forget.wait_s)
        return await self.forget.get(tenant_id, job_id)

    async def run(self, job: ForgetJob) -> Outcome:
        """The erasure, in the forget worker (`ForgetExecutor.runners`), its target opened. A hold placed on the
        whole subject since it was queued parks the job on it (`held`)."""
        tenant_id, target = job.tenant_id, job.target
        subject_id = str(target["subject_id"])
        async with self.db.transaction() as tx:
            standing = await holds_repo.covering(InSession(tx), tenant_id, subjects=[subject_id])
        if standing is not None:
            raise Held(standing.id, {"subject_id": subject_id})
        query, min_similarity = target.get("query"), target.get("min_similarity")
        plan = await self.plan(tenant_id, subject_id, target.get("text") or (), query=query,
                               min_similarity=min_similarity)
        held = list(plan.held)
        jobs: list[str] = []
        leaves: list[int] = []
        plaintext = False
        erased_sessions: list[str] = []
        per_session: list[dict[str, Any]] = []
        for session_id in plan.sessions:
            try:
                deleted = await self.sessions.delete(tenant_id, session_id, erasure=True)
            except NotFound:  # deleted meanwhile: nothing of it is left to erase
                continue
            except LegalHold as hold:  # placed since the plan read: skipped, like the plan's
                held.append({"hold_id": hold.hold_id, "session_id": session_id})
                continue
            erased_sessions.append(session_id)
            per_session.append({"session_id": session_id, "forget_id": deleted.forget_id,
                                "keys": len(set(deleted.erased.leaves))})
            leaves += deleted.erased.leaves
            plaintext = plaintext or deleted.erased.plaintext > 0
            jobs += [deleted.forget_id] if deleted.forget_id else []
        tombstoned = 0
        for namespace, keys in plan.memory_keys.items():
            for key in keys:
                try:
                    outcome = await self.memory.forget(tenant_id, namespace, key, source="subject_erasure")
                except LegalHold as hold:
                    held.append({"hold_id": hold.hold_id, "namespace": namespace})
                    break
                tombstoned += not outcome.already_forgotten
                leaves += outcome.leaves
                jobs += [outcome.forget_id] if outcome.forget_id else []
        others = await self._forget_also(tenant_id, plan, query, min_similarity, held)
        entry = SubjectEntry(
            subject_id=subject_id, sessions=erased_sessions,
            conversations=[plan.conversation_of[s] for s in erased_sessions if s in plan.conversation_of],
            namespaces=[n for n in plan.namespaces if not any(h.get("namespace") == n for h in held)],
            memory_keys=tombstoned, jobs=jobs, also=others, held=held, per_session=per_session,
        )
        shred = sorted(set(leaves))
        # Nothing sealed erased (nothing owned, or only plaintext from before sealing): no promise at rest.
        promised = bool(shred) and not plaintext
        receipt = JobReceipt(subject=entry, erasure_horizon_s=self.horizon_s if promised else None)
        async with self.db.transaction() as tx:
            await repo.mark_erased(tx, tenant_id, subject_id, job.id)
            for hold_id in sorted({h["hold_id"] for h in held}):  # releasing the hold runs this erasure again
                await holds_repo.defer(InSession(tx), tenant_id, hold_id, subject_id)
                await holds_repo.event(InSession(tx), tenant_id, hold_id, "deferred", None,
                                       {"subject_id": subject_id, "forget_id": job.id})
        if self.metrics is not None:
            self.metrics.erasures.labels(reason="subject", kind="session").inc(len(erased_sessions))
            self.metrics.erasures.labels(reason="subject", kind="memory_key").inc(tombstoned)
            self.metrics.erasures_held.labels(reason="subject").inc(len(held))
        return Outcome(receipt, shred)

    async def _forget_also(self, tenant_id: str, plan: Plan, query: str | None, min_similarity: float | None,
                           held: list[dict[str, str]]) -> list[dict[str, str]]:
        """The forgets `also` asks for in other subjects' sessions, queued, each a selective replay the forget worker
        runs (its receipt says when done): `{session_id, forget_id}` of each; a session a hold covers now is added
        to `held` instead."""
        targets: list[tuple[str, dict[str, Any]]] = [
            (s, {"session_id": s, "text": t}) for s, texts in plan.also.items() for t in texts
        ]
        if query is not None:
            targets += [(s, {"session_id": s, "query": query, "min_similarity": min_similarity})
                        for s in plan.also_query]
        others: list[dict[str, str]] = []
        refused: set[str] = set()
        for session_id, target in targets:
            if session_id in refused:
                continue
            try:
                job = await self.forget.submit(tenant_id, Submission(target=target))
            except LegalHold as hold:
                held.append({"hold_id": hold.hold_id, "session_id": session_id})
                refused.add(session_id)
                continue
            others.append({"session_id": session_id, "forget_id": job.id})
        return others
