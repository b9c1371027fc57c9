"""The session service: the one facade the routers, the OpenAI-compatible layer and the forget service use.

It creates, reads, lists and deletes sessions and answers artifact queries itself; transitions (turns, compactions)
are commit.py, the session lease is locking.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Final

from sqlalchemy.ext.asyncio import AsyncSession

from app import pagination
from app.db.consistency import PRIMARY, ReadFrom
from app.db.database import Database
from app.db.models import AgentSession
from app.db.statements import InSession
from app.embeddings import Embedder
from app.engine.protocol import ChatTemplate, KVEngine, TokenSink
from app.engine.session_caches import SessionCaches
from app.engine.slot import EngineSlot
from app.errors import Conflict, NotFound, NotReady
from app.forget.repositories import jobs as jobs_repo
from app.holds.guard import refuse_session
from app.ids import new_id
from app.keys.content import Sealer
from app.memory.in_transaction import injectable_in
from app.runtime.blocks import Block, Observation, memory_observation, render
from app.runtime.routing import session_route
from app.runtime.tool_catalog import preamble as tool_preamble
from app.runtime.transition import Machinery, PolicyLookup, SessionState, TransitionInput, step
from app.runtime.writes import write_step
from app.sessions.commit import OnCommit, Transitions
from app.sessions.locking import DEFAULT_LEASE_S, DEFAULT_LOCK_TIMEOUT_S, Lease, SessionLocks, require
from app.sessions.repositories import artifacts as artifacts_repo
from app.sessions.repositories import leases as leases_repo
from app.sessions.repositories import sessions as sessions_repo
from app.sessions.repositories.artifacts import Retired
from app.sessions.views import ArtifactView, Deleted, SessionConfig, SessionView, TurnResult, parse_calls_json
from app.subjects import repository as subjects_repo
from app.tool_calls import ToolCall

MAX_INJECTED = 256  # memory records injected at session start; a namespace larger than that needs retrieval
INJECTION_ATTEMPTS = 5  # renders of a namespace's records that a concurrent write can invalidate before 409
DELETED: Final = "session_delete"  # the strategy of the finished forget job a session deletion records its shred on
DEFAULT_HORIZON_S: Final = 300  # Settings.erasure_horizon_s's default

# Punctures a deletion's leaves and marks its job's shred complete; False when the key provider refused (the forget
# worker's sweep retries it). The container passes the process's `Shredder.settle` (app/forget/shredding.py).
Settle = Callable[[str, str | None, list[int]], Awaitable[bool]]


class SessionService:
    def __init__(
        self,
        db: Database,
        engine: EngineSlot,
        handles: SessionCaches,
        embedder: Embedder,
        policies: PolicyLookup,
        sealer: Sealer,
        *,
        lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
        lease_s: float = DEFAULT_LEASE_S,
        on_wait: Callable[[int], None] | None = None,
        settle: Settle | None = None,
        horizon_s: int = DEFAULT_HORIZON_S,
    ) -> None:
        self.db = db
        self.slot = engine
        self.handles = handles
        self.embedder = embedder  # the process's shared one: a new one would load the model again
        self.policies = policies
        self.sealer = sealer  # the process's: session content, and memory records injected, sealed and opened with it
        self.locks = SessionLocks(db, sealer, handles, lock_timeout_s, lease_s=lease_s, on_wait=on_wait)
        self.transitions = Transitions(self.locks, policies, sealer)
        self.settle = settle  # None: a deletion's shred waits for the forget worker's sweep
        self.horizon_s = horizon_s

    async def chat(self) -> ChatTemplate:
        """The engine's chat template (503 while the model loads)."""
        return (await self._engine()).chat

    async def _engine(self) -> KVEngine:
        if not await self.slot.available():
            raise NotReady("the model is not loaded yet", headers={"Retry-After": "5"})
        return self.slot.engine

    def _machinery(self, engine: KVEngine) -> Machinery:
        return Machinery(engine, self.handles, self.embedder, self.db, self.sealer)

    # -- sessions -----------------------------------------------------------------------------------------------

    async def create(self, tenant_id: str, config: SessionConfig) -> SessionView:
        self.policies.named(config.context_policy).check(config.tools, config.compaction)
        blocks: list[Block] = []
        needs_engine = config.system_prompt is not None or bool(config.tools) or config.memory_namespace is not None
        engine = await self._engine() if needs_engine else self.slot.engine
        if config.system_prompt is not None:
            blocks.append(render(engine.chat, Observation("system", config.system_prompt)))
        if config.tools:
            blocks.append(render(engine.chat, Observation("instruction", tool_preamble(config.tools))))
        session_id = new_id("ses")
        for _ in range(INJECTION_ATTEMPTS):
            memory = await self._memory_blocks(tenant_id, config.memory_namespace, engine)
            async with self.db.transaction() as tx:
                if config.memory_namespace is not None:
                    # Read again in this transaction, under a share lock: a concurrent forget of a record either waits
                    # for this session (and its cascade then replays it) or lands first (and the record is not
                    # injected). The blocks were rendered from the first read, outside any transaction; if a record
                    # changed in between, render again.
                    locked = await injectable_in(
                        tx, self.sealer, tenant_id, config.memory_namespace, limit=MAX_INJECTED
                    )
                    rendered = [(b.meta["key"], int(b.meta["version"])) for b in memory]
                    if [(r.key, r.version) for r in locked] != rendered:
                        continue
                if config.subject_id is not None:
                    await subjects_repo.ensure(tx, tenant_id, config.subject_id)
                row = await sessions_repo.create(
                    tx, self.sealer, id=session_id, tenant_id=tenant_id, epoch=0, status="idle",
                    subject_id=config.subject_id, system_prompt=config.system_prompt,
                    memory_namespace=config.memory_namespace,
                    context_policy=config.context_policy, checkpoint_policy=config.checkpoint_policy,
                    retrieval=config.retrieval, tools=config.tools, sampling=config.sampling,
                    compaction=config.compaction, turns=0,
                    token_count=sum(len(b.token_ids) for b in [*blocks, *memory]),
                )
                start = TransitionInput(0, [*blocks, *memory], generate=False)
                done = await step(self._machinery(engine), row, self.policies.of(row), SessionState([], 0), start)
                # Transition 0 runs no model: nothing is computed here.
                await write_step(tx, self.sealer, session_id, done)
            return SessionView(row, "idle")
        raise Conflict(f"the memory namespace {config.memory_namespace!r} keeps changing; retry")

    async def _memory_blocks(self, tenant_id: str, namespace: str | None, engine: KVEngine) -> list[Block]:
        """The namespace's live records as memory blocks, rendered outside any transaction."""
        if namespace is None:
            return []
        async with self.db.transaction() as tx:
            records = await injectable_in(tx, self.sealer, tenant_id, namespace, limit=MAX_INJECTED)
        return [render(engine.chat, memory_observation(namespace, r.key, r.version, r.value)) for r in records]

    async def get(self, tenant_id: str, session_id: str, *, where: ReadFrom = PRIMARY) -> SessionView:
        """`where` (here and in the other reads): the primary by default; the HTTP routes let a replica serve them
        as the request's consistency token allows (app/db/replicas.py)."""

        async def read(tx: AsyncSession) -> SessionView:
            row = await require(tx, self.sealer, tenant_id, session_id)
            status = (await leases_repo.statuses(tx, [row.id]))[row.id]
            return SessionView(row, status, await _pending(tx, self.sealer, row))

        return await self.db.read(where, read)

    async def page(
        self, tenant_id: str, *, cursor: str | None, limit: int, status: str | None, context_policy: str | None,
        where: ReadFrom = PRIMARY,
    ) -> tuple[list[SessionView], str | None]:
        """A page of the tenant's sessions, newest first, with the status and pending calls `get` reports."""
        after = None if cursor is None else pagination.decode(cursor)

        async def read(tx: AsyncSession) -> tuple[list[AgentSession], list[SessionView]]:
            rows = await sessions_repo.page(
                tx, self.sealer, tenant_id, after=after, limit=limit + 1, status=status, context_policy=context_policy
            )
            page = rows[:limit]
            statuses = await leases_repo.statuses(tx, [r.id for r in page])
            return rows, [SessionView(row, statuses[row.id], await _pending(tx, self.sealer, row)) for row in page]

        rows, views = await self.db.read(where, read)
        positions = [pagination.Position(r.created_at, r.id) for r in rows]
        return views, pagination.next_cursor(positions, limit)

    async def delete(self, tenant_id: str, session_id: str, *, erasure: bool = False) -> Deleted:
        """Purge the session and shred every leaf its content was sealed under (docs/erasure-at-rest.md): the leaves
        are recorded on a finished forget job (strategy `session_delete`) in the deleting transaction, so a shred
        the key provider refuses now stays pending and the forget worker's sweep retries it. Returns that job and
        what it erased (a subject's erasure collects them).

        `erasure`: someone asked for the session to be gone (DELETE, a conversation's deletion, a subject's
        erasure), so a standing legal hold over it refuses the deletion (409 `legal_hold`). Lethe's own housekeeping
        (a session opened for one request, one a conversation moved off) is not an erasure."""
        # Under the session's lease: it waits out a turn in flight rather than racing it.
        async with self.locks.leased(tenant_id, session_id, "running") as lease, lease.commit() as (tx, _):
            if erasure:
                await refuse_session(InSession(tx), tenant_id, session_id)
            erased = await sessions_repo.delete_session(tx, tenant_id, session_id)
            shred = await self._record_shred(tx, tenant_id, session_id, erased)
        if shred is not None and self.settle is not None:
            await self.settle(tenant_id, shred, erased.leaves if erased else [])
        handle = await self.handles.drop(session_route(tenant_id, session_id))
        if handle is not None and self.slot.ready:
            await self.slot.engine.release(handle)
        return Deleted(shred, erased or Retired())

    async def _record_shred(self, tx: AsyncSession, tenant_id: str, session_id: str, erased: Retired | None
                            ) -> str | None:
        """The job recording a deletion's leaves (None: it erased nothing sealed). Its receipt promises erasure at
        rest only when nothing the deletion erased was plaintext from before the sealing migrations."""
        if erased is None or not erased.leaves:
            return None
        job_id = new_id("fgt")
        receipt = {"duration_ms": 0, "erasure_horizon_s": None if erased.plaintext else self.horizon_s}
        await jobs_repo.queue(
            InSession(tx), self.sealer, id=job_id, tenant_id=tenant_id, strategy=DELETED,
            target={"session_id": session_id},
            reason=None, receipt=receipt, finished=True, shred_leaves=erased.leaves,
        )
        return job_id

    def leased(
        self, tenant_id: str, session_id: str, status: str, timeout_s: float
    ) -> AbstractAsyncContextManager[Lease]:
        """The session to oneself, as a turn has it (locking.py): a forget takes it with status `forgetting`, runs
        its whole rebuild under it, and commits its swap with `Lease.commit`; a turn that arrives meanwhile waits
        and then applies to the new state."""
        return self.locks.leased(tenant_id, session_id, status, timeout_s)

    # -- transitions --------------------------------------------------------------------------------------------

    async def turn(
        self,
        tenant_id: str,
        session_id: str,
        observations: Sequence[Observation],
        generate: bool = True,
        on_tokens: TokenSink | None = None,
        *,
        sampling: Mapping[str, Any] | None = None,
        expect_turns: int | None = None,
        reply_id: str | None = None,
        on_commit: OnCommit | None = None,
    ) -> TurnResult:
        """One transition. `on_tokens` receives the reply's tokens as they are sampled (SSE streaming).

        `sampling` overrides the session's sampling for this transition only (stored with the session under
        `per_turn`, so a forget replays it the same way); `expect_turns` makes the transition conditional on the
        session's transition count (StaleHead otherwise: another client moved the session on); `reply_id` is the id
        the reply's artifact takes (a stream announces it before the reply exists); `on_commit` runs in the
        transaction that commits the transition, with its result (what a front door stores about it, e.g. an
        OpenAI response row, commits with it or not at all)."""
        empty = not observations and not generate
        # An empty transition is bookkeeping only (what a forget leaves where an observation held only the target):
        # it needs no engine, so it works while the model loads.
        engine = self.slot.engine if empty else await self._engine()
        return await self.transitions.turn(
            self._machinery(engine), tenant_id, session_id, observations, generate, on_tokens,
            sampling=sampling, expect_turns=expect_turns, reply_id=reply_id, on_commit=on_commit,
        )

    async def compact(
        self, tenant_id: str, session_id: str, *, keep_last_turns: int, write_back: bool
    ) -> tuple[SessionView, str]:
        """A compaction transition (runtime/compaction.py); with `write_back`, the summary is also written into the
        session's memory namespace as `summary.<session id>` with source `summarizer` and the summary's provenance,
        in the same transaction. Returns the session and the summary artifact's id."""
        row, summary_id = await self.transitions.compact(
            self._machinery(await self._engine()), tenant_id, session_id, keep_last_turns=keep_last_turns,
            write_back=write_back,
        )
        return SessionView(row, "idle"), summary_id

    # -- artifacts ----------------------------------------------------------------------------------------------

    async def artifacts(self, tenant_id: str, session_id: str, *, where: ReadFrom = PRIMARY) -> list[ArtifactView]:
        async def read(tx: AsyncSession) -> list[ArtifactView]:
            await require(tx, self.sealer, tenant_id, session_id)
            rows = await artifacts_repo.list_live(tx, self.sealer, tenant_id, session_id)
            parents = await artifacts_repo.parents_of(tx, session_id)
            return [ArtifactView(a, parents.get(a.id, [])) for a in rows]

        return await self.db.read(where, read)

    async def descendants(
        self, tenant_id: str, session_id: str, artifact_id: str, *, where: ReadFrom = PRIMARY
    ) -> list[ArtifactView]:
        async def read(tx: AsyncSession) -> list[ArtifactView]:
            await require(tx, self.sealer, tenant_id, session_id)
            if await artifacts_repo.get(tx, self.sealer, tenant_id, session_id, artifact_id) is None:
                raise NotFound(f"no artifact {artifact_id!r} in session {session_id!r}")
            rows = await artifacts_repo.closure(tx, self.sealer, tenant_id, session_id, artifact_id)
            parents = await artifacts_repo.parents_of(tx, session_id, [a.id for a in rows])
            return [ArtifactView(a, parents.get(a.id, [])) for a in rows]

        return await self.db.read(where, read)


async def _pending(tx: AsyncSession, sealer: Sealer, row: AgentSession) -> list[ToolCall]:
    """The session's tool calls still waiting for a client's tool_result."""
    calls = await artifacts_repo.pending_calls(tx, sealer, row.id) if row.tools else []
    return [c for a in calls for c in parse_calls_json(a.content)]
