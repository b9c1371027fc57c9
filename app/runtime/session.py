"""The session service: creates sessions and commits transitions R_t = F(R_{t-1}, o_t).

One transition is one unit of work: lock the session row (bounded wait; a waiter past the bound gets 409
session_busy), read the stored log, run F on the engine (transition.py), then write its artifacts, provenance edges,
checkpoints and the session's counters in the same transaction. The row lock is held across the model call, so turns
on one session are serialized across every API process on the database; if the model call fails nothing is written
and this process's cache handle is cropped back before the lock is released.

Transition 0 is the system block and the injected memory records, written at creation without an engine call (the
first turn prefills them in a call of their own, and a replay does the same, see transition.py). Transition t (t ≥ 1)
is the t-th POST of turns.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app import pagination
from app.container import EngineSlot
from app.db.models import AgentSession, Artifact
from app.db.repositories import artifacts as artifacts_repo
from app.db.repositories import sessions as sessions_repo
from app.db.repositories import tools as tools_repo
from app.db.session import Database
from app.embeddings import Embedder
from app.engine.protocol import ChatTemplate, KVEngine, TokenSink
from app.errors import Conflict, InvalidRequest, NotFound, NotReady, SessionBusy
from app.ids import new_id
from app.memory import repository as memory_repo
from app.provenance import graph
from app.runtime import checkpoints, retrieval
from app.runtime.blocks import Block, Observation, memory_observation, render
from app.runtime.compaction import Compaction, LiveRow, compact, summary_room
from app.runtime.compaction import plan as compaction_plan
from app.runtime.context import RetrievedContext
from app.runtime.handles import HandleRegistry
from app.runtime.records import TransitionRecords, plan_records, stored_log
from app.runtime.salts import salt_of
from app.runtime.tooling import ToolContext, ToolStep, advance_with_tools
from app.runtime.tools import ToolCall
from app.runtime.tools import preamble as tool_preamble
from app.runtime.transition import Outcome, Usage, check_room, rewind, sampling_for, sync

MAX_INJECTED = 256  # memory records injected at session start; a namespace larger than that needs retrieval
DEFAULT_LOCK_TIMEOUT_S = 30.0  # longer than a typical turn, so turns queued behind one another do not fail


@dataclass(frozen=True)
class SessionConfig:
    system_prompt: str | None = None
    memory_namespace: str | None = None
    context_policy: str = "full"
    retrieval: dict[str, Any] = field(default_factory=dict)
    checkpoint_policy: str = "every_turn"
    tools: list[dict[str, Any]] = field(default_factory=list)
    sampling: dict[str, Any] = field(default_factory=dict)
    compaction: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SessionView:
    row: AgentSession
    status: str
    pending: list[ToolCall] = field(default_factory=list)


@dataclass(frozen=True)
class ArtifactView:
    row: Artifact
    parents: list[str]


@dataclass(frozen=True)
class TurnResult:
    turn: int
    epoch: int
    input_ids: list[str]
    reply_id: str | None
    reply_content: str | None
    usage: Usage
    finish_reason: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)


class SessionService:
    def __init__(
        self,
        db: Database,
        engine: EngineSlot,
        handles: HandleRegistry,
        *,
        lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
        embedder: Embedder | None = None,
    ) -> None:
        self.db = db
        self.slot = engine
        self.handles = handles
        self.lock_timeout_s = lock_timeout_s
        # Pass the process's shared embedder: a new one loads the model again (only retrieval sessions use it).
        self.embedder = embedder or Embedder()

    def chat(self) -> ChatTemplate:
        """The engine's chat template (503 while the model loads)."""
        return self._engine().chat

    def _engine(self) -> KVEngine:
        if not self.slot.ready:
            raise NotReady("the model is not loaded yet", headers={"Retry-After": "5"})
        return self.slot.engine

    # -- sessions -----------------------------------------------------------------------------------------------

    async def create(self, tenant_id: str, config: SessionConfig) -> SessionView:
        blocks: list[Block] = []
        if config.system_prompt is not None:
            blocks.append(render(self._engine().chat, Observation("system", config.system_prompt)))
        if config.tools:
            blocks.append(render(self._engine().chat, Observation("instruction", tool_preamble(config.tools))))
        session_id = new_id("ses")
        async with self.db.transaction() as tx:
            if config.memory_namespace is not None:
                # Read under FOR SHARE in this transaction: a concurrent forget of a record either waits for this
                # session (and its cascade then replays it) or lands first (and the record is not injected).
                records = await memory_repo.injectable(tx, tenant_id, config.memory_namespace, limit=MAX_INJECTED)
                chat = self._engine().chat
                blocks.extend(
                    render(chat, memory_observation(config.memory_namespace, r.key, r.version, r.value))
                    for r in records
                )
            row = await sessions_repo.create(
                tx,
                id=session_id,
                tenant_id=tenant_id,
                epoch=0,
                status="idle",
                system_prompt=config.system_prompt,
                memory_namespace=config.memory_namespace,
                context_policy=config.context_policy,
                checkpoint_policy=config.checkpoint_policy,
                retrieval=config.retrieval,
                tools=config.tools,
                sampling=config.sampling,
                compaction=config.compaction,
                turns=0,
                token_count=sum(len(b.token_ids) for b in blocks),
            )
            planned = plan_records(tenant_id, session_id, 0, [], blocks, None, row.context_policy)
            await artifacts_repo.insert_artifacts(tx, planned.artifacts)
            marks = checkpoints.at_session_start(row.checkpoint_policy, planned.manifest_after)
            await sessions_repo.add_checkpoints(tx, session_id, _rows(marks))
        return SessionView(row, "idle")

    async def get(self, tenant_id: str, session_id: str) -> SessionView:
        async with self.db.transaction() as tx:
            row = await self._require(tx, tenant_id, session_id)
            status = row.status
            if status == "idle" and await sessions_repo.is_locked(tx, tenant_id, session_id):
                status = "running"
            pending = await artifacts_repo.pending_calls(tx, session_id) if row.tools else []
        return SessionView(row, status, [c for a in pending for c in parse_calls_json(a.content)])

    async def page(
        self, tenant_id: str, *, cursor: str | None, limit: int, status: str | None, context_policy: str | None
    ) -> tuple[list[SessionView], str | None]:
        """A page of the tenant's sessions, newest first, with the status and pending calls `get` reports."""
        after = None if cursor is None else pagination.decode(cursor)
        async with self.db.transaction() as tx:
            rows = await sessions_repo.page(
                tx, tenant_id, after=after, limit=limit + 1, status=status, context_policy=context_policy
            )
            page = rows[:limit]
            locked = await sessions_repo.locked_ids(tx, tenant_id, [r.id for r in page if r.status == "idle"])
            views = []
            for row in page:
                pending = await artifacts_repo.pending_calls(tx, row.id) if row.tools else []
                status_now = "running" if row.id in locked else row.status
                views.append(SessionView(row, status_now, [c for a in pending for c in parse_calls_json(a.content)]))
        positions = [pagination.Position(r.created_at, r.id) for r in rows]
        return views, pagination.next_cursor(positions, limit)

    async def delete(self, tenant_id: str, session_id: str) -> None:
        async with self._queued(tenant_id, session_id) as deadline, self.db.transaction() as tx:
            await self._lock(tx, tenant_id, session_id, deadline)  # waits out a turn in flight rather than racing it
            await sessions_repo.delete_session(tx, tenant_id, session_id)
        handle = self.handles.pop(session_id)
        if handle is not None and self.slot.ready:
            await self.slot.engine.release(handle)

    async def _require(self, tx: AsyncSession, tenant_id: str, session_id: str) -> AgentSession:
        row = await sessions_repo.get(tx, tenant_id, session_id)
        if row is None:
            raise NotFound(f"no session {session_id!r}")
        return row

    @asynccontextmanager
    async def exclusive(
        self, tenant_id: str, session_id: str, timeout_s: float
    ) -> AsyncIterator[tuple[AsyncSession, AgentSession]]:
        """The session to oneself, as a turn has it: the row locked in a transaction that commits on exit. A forget
        runs its whole rebuild inside, so a turn that arrives meanwhile waits and then applies to the new state."""
        async with self._queued(tenant_id, session_id, timeout_s) as deadline, self.db.transaction() as tx:
            yield tx, await self._lock(tx, tenant_id, session_id, deadline)

    @asynccontextmanager
    async def _queued(self, tenant_id: str, session_id: str, timeout_s: float | None = None) -> AsyncIterator[float]:
        """Wait in this process's queue for the session (bounded); yields the deadline left for the row lock.

        Only the session's own tenant queues: another tenant's request on the id answers 404 at once, instead of
        waiting behind (or delaying) the owner's turns and answering 409, which would tell it the session exists."""
        async with self.db.transaction() as tx:
            await self._require(tx, tenant_id, session_id)
        bound = self.lock_timeout_s if timeout_s is None else timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + bound
        queue = self.handles.queue(session_id)
        try:
            await asyncio.wait_for(queue.acquire(), bound)
        except TimeoutError:
            raise _busy(session_id) from None
        try:
            yield deadline
        finally:
            queue.release()

    async def _lock(self, tx: AsyncSession, tenant_id: str, session_id: str, deadline: float) -> AgentSession:
        left = max(0.05, deadline - asyncio.get_running_loop().time())
        try:
            row = await sessions_repo.lock(tx, tenant_id, session_id, left)
        except sessions_repo.LockTimeout:
            raise _busy(session_id) from None
        if row is None:
            # Deleted elsewhere: this process's handle is garbage now. Only then: a request naming another
            # tenant's session must leave everything of it alone, its cache handle included.
            if await sessions_repo.tenant_of(tx, session_id) is None:
                self.handles.pop(session_id)
            raise NotFound(f"no session {session_id!r}")
        if row.status == "forgetting":
            # A forget that marks the session and works outside the row lock: nothing may change under it.
            raise SessionBusy(f"session {session_id!r} is being forgotten; retry later", headers={"Retry-After": "2"})
        return row

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
    ) -> TurnResult:
        """One transition. `on_tokens` receives the reply's tokens as they are sampled (SSE streaming).

        `sampling` overrides the session's sampling for this transition only (stored with the session under
        `per_turn`, so a forget replays it the same way); `expect_turns` makes the transition conditional on the
        session's transition count (StaleHead otherwise: another client moved the session on); `reply_id` is the id
        the reply's artifact takes (a stream announces it before the reply exists)."""
        empty = not observations and not generate
        # An empty transition is bookkeeping only (what a forget leaves where an observation held only the target):
        # it needs no engine, so it works while the model loads.
        engine = None if empty else self._engine()
        blocks = [] if engine is None else [render(engine.chat, o) for o in observations]
        async with self._queued(tenant_id, session_id) as deadline, self.db.transaction() as tx:
            row = await self._lock(tx, tenant_id, session_id, deadline)
            if expect_turns is not None and row.turns != expect_turns:
                raise StaleHead(f"session {session_id!r} moved on: {row.turns} transitions, expected {expect_turns}")
            turn = row.turns + 1
            if sampling and engine is not None:
                per_turn = {**(row.sampling.get("per_turn") or {}), str(turn): dict(sampling)}
                row.sampling = {**row.sampling, "per_turn": per_turn}
                await sessions_repo.set_sampling(tx, row.id, row.sampling)
            answered = await self._check_tool_results(tx, row, observations)
            log = await artifacts_repo.load_log(tx, session_id)
            step = ToolStep()
            if engine is None:
                outcome = None
                records = plan_records(tenant_id, session_id, turn, log, [], None, row.context_policy)
                await self._write(tx, row, turn, records)
            else:
                outcome, records, step = await self._run(
                    tx, engine, row, turn, log, blocks, generate, on_tokens, reply_id
                )
            await self._commit_client_calls(tx, row, answered)
            if engine is not None:
                await self._auto_compact(tx, engine, row)
        return _result(turn, row.epoch, records, outcome, step.calls)

    async def _check_tool_results(
        self, tx: AsyncSession, row: AgentSession, observations: Sequence[Observation]
    ) -> list[str]:
        """In a session with tools, a tool_result must answer one of its pending calls (422 otherwise); returns the
        ids answered. A session without tools takes any tool_result: the client runs its own tool loop."""
        ids = [o.meta.get("tool_call_id", "") for o in observations if o.kind == "tool_result"]
        if not row.tools or not ids:
            return []
        pending = {(a.meta or {}).get("tool_call_id") for a in await artifacts_repo.pending_calls(tx, row.id)}
        unknown = [i for i in ids if i not in pending]
        if unknown or len(set(ids)) != len(ids):
            raise InvalidRequest(f"tool_result answers no pending tool call of this session: {sorted(set(unknown))}")
        return ids

    async def _commit_client_calls(self, tx: AsyncSession, row: AgentSession, answered: list[str]) -> None:
        """A client's answer to a consequential call of its own is the call having fired: mark it and record it in
        the ledger, so a replay never asks for it again."""
        consequential = {t["name"] for t in row.tools if t.get("kind") == "consequential" and not t.get("builtin")}
        calls = [
            ToolCall(str(a.meta["tool_call_id"]), a.meta.get("name", ""), {})
            for a in await artifacts_repo.tool_calls(tx, row.id, answered)
            if (a.meta or {}).get("name") in consequential
        ]
        if calls:
            await artifacts_repo.mark_committed(tx, row.id, [c.id for c in calls])
            await tools_repo.record_fired(tx, row.id, calls)

    async def _run(
        self, tx: AsyncSession, engine: KVEngine, row: AgentSession, turn: int, log: list[artifacts_repo.LogEntry],
        blocks: list[Block], generate: bool, on_tokens: TokenSink | None = None, reply_id: str | None = None,
    ) -> tuple[Outcome, TransitionRecords, ToolStep]:
        if row.context_policy == "retrieval":
            outcome, records = await self._run_retrieval(
                tx, engine, row, turn, log, blocks, generate, on_tokens, reply_id
            )
            return outcome, records, ToolStep()
        stored = stored_log(log)
        room = check_room(engine, len(stored.tokens), sum(len(b.token_ids) for b in blocks), generate)
        sampling = sampling_for(row.sampling, turn, room) if generate else None
        synced = await sync(engine, self.handles.get(row.id), row.id, salt_of(row), stored)
        self.handles.put(row.id, synced.handle)
        try:
            tools = await self._tool_context(tx, row)
            sources = frozenset(s for entry in log for s in entry.source_ids)
            outcome, step = await advance_with_tools(
                engine, synced, blocks, sampling, tools, turn, sources, on_tokens
            )
            records = plan_records(
                row.tenant_id, row.id, turn, log, outcome.blocks, outcome, row.context_policy,
                _reply_keep_ids(outcome, reply_id),
            )
            await self._write(tx, row, turn, records)
            if tools is not None:
                await tools_repo.record_fired(tx, row.id, step.fired_now)
                if step.env_changed:
                    await tools_repo.save_environment(tx, row.id, turn, tools.env)
                await tools_repo.link_checkpoints(tx, row.id, turn - 1)
        except BaseException:
            # Nothing of the transition is written; crop the handle back while the row lock still keeps every other
            # turn of this session away from it. (A failed commit after this point leaves the handle ahead of the
            # database: the next turn's sync crops it.)
            try:
                await rewind(engine, synced.handle, len(stored.tokens))
            except Exception:
                self.handles.pop(row.id)  # a handle in doubt is dropped; the next turn rebuilds from the database
            raise
        return outcome, records, step

    async def _run_retrieval(
        self, tx: AsyncSession, engine: KVEngine, row: AgentSession, turn: int, log: list[artifacts_repo.LogEntry],
        blocks: list[Block], generate: bool, on_tokens: TokenSink | None = None, reply_id: str | None = None,
    ) -> tuple[Outcome, TransitionRecords]:
        """A transition of a retrieval session (retrieval.py): store the observations, and answer them from the
        preamble and the messages retrieved for them; every new message gets its embedding in the same commit."""
        await retrieval.embed_missing(tx, self.embedder, row.id)
        vectors = await self.embedder.embed([b.content for b in blocks])
        preamble_ids, preamble_tokens = retrieval.preamble(log)
        context: list[artifacts_repo.Neighbor] = []
        answer = None
        if generate:
            query = vectors[0] if len(blocks) == 1 else (await self.embedder.embed([retrieval.query_text(blocks)]))[0]
            context = await retrieval.retrieve(tx, row.id, query, retrieval.Params.of(row.retrieval), turn)
            answer = await retrieval.respond(
                engine, self.handles, row.id, salt_of(row), preamble_tokens, context, blocks,
                lambda room: sampling_for(row.sampling, turn, room), on_tokens,
            )
        reply = None if answer is None else answer.reply
        usage = Usage(0, 0, 0, 0, 0) if answer is None else answer.usage
        outcome = Outcome(
            [*blocks, *([reply] if reply else [])], reply, usage, None if answer is None else answer.finish_reason,
            0, None,
        )
        parents = RetrievedContext(preamble_ids, [m.id for m in context])
        records = plan_records(
            row.tenant_id, row.id, turn, log, outcome.blocks, outcome, parents, _reply_keep_ids(outcome, reply_id)
        )
        await self._write(tx, row, turn, records)
        if reply is not None:
            vectors.extend(await self.embedder.embed([reply.content]))
        await artifacts_repo.set_embeddings(
            tx, {a["id"]: v for a, v in zip(records.artifacts, vectors, strict=True)}
        )
        return outcome, records

    async def _tool_context(self, tx: AsyncSession, row: AgentSession) -> ToolContext | None:
        if not row.tools:
            return None
        _, env = await tools_repo.environment(tx, row.id)
        fired = await tools_repo.fired(tx, row.id)
        return ToolContext(row.id, row.tools, env, fired, frozenset(row.flagged_sources))

    async def _write(self, tx: AsyncSession, row: AgentSession, turn: int, records: TransitionRecords) -> None:
        await artifacts_repo.insert_artifacts(tx, records.artifacts)
        await artifacts_repo.insert_edges(tx, records.edges)
        marks = checkpoints.for_transition(
            row.checkpoint_policy, turn, records.kinds, records.manifest_before, records.manifest_after
        )
        await sessions_repo.add_checkpoints(tx, row.id, _rows(marks))
        await sessions_repo.record_transition(tx, row.id, turns=turn, token_count=records.token_count)
        row.turns, row.token_count = turn, records.token_count

    async def compact(
        self, tenant_id: str, session_id: str, *, keep_last_turns: int, write_back: bool
    ) -> tuple[SessionView, str]:
        """A compaction transition (compaction.py); with `write_back`, the summary is also written into the session's
        memory namespace as `summary.<session id>` with source `summarizer` and the summary's provenance, in the
        same transaction. Returns the session and the summary artifact's id."""
        engine = self._engine()
        async with self._queued(tenant_id, session_id) as deadline, self.db.transaction() as tx:
            row = await self._lock(tx, tenant_id, session_id, deadline)
            summary_id = await self._compact_locked(tx, engine, row, keep_last_turns, write_back)
        return SessionView(row, "idle"), summary_id

    async def _compact_locked(
        self, tx: AsyncSession, engine: KVEngine, row: AgentSession, keep_last_turns: int, write_back: bool
    ) -> str:
        """The compaction transition, inside the caller's locked transaction."""
        if write_back and row.memory_namespace is None:
            raise Conflict("write_back needs the session's memory_namespace")
        turn = row.turns + 1
        log = await artifacts_repo.load_log(tx, row.id)
        live = [LiveRow.of(a) for a in await artifacts_repo.list_live(tx, row.tenant_id, row.id)]
        _, summarized, _ = compaction_plan(live, keep_last_turns)  # 409 before any model work: nothing to compact
        if row.context_policy == "retrieval":
            summary_id, text = await self._summarize_retrieval(tx, engine, row, turn, log, summarized)
            if write_back:
                assert row.memory_namespace is not None
                await memory_repo.write_back(
                    tx, row.tenant_id, row.memory_namespace, f"summary.{row.id}", text,
                    {"session_id": row.id, "artifact_id": summary_id},
                )
            return summary_id
        stored = stored_log(log)
        room = summary_room(engine, len(stored.tokens))
        synced = await sync(engine, self.handles.get(row.id), row.id, salt_of(row), stored)
        self.handles.put(row.id, synced.handle)
        try:
            done = await compact(
                engine, synced, live, tenant_id=row.tenant_id, session_id=row.id, turn=turn,
                sampling=sampling_for(row.sampling, turn, room), keep_last_turns=keep_last_turns,
                next_position=await artifacts_repo.max_position(tx, row.id) + 1,
            )
            await self._write_compaction(tx, row, turn, live, done)
            if write_back:
                assert row.memory_namespace is not None
                await memory_repo.write_back(
                    tx, row.tenant_id, row.memory_namespace, f"summary.{row.id}", done.summary,
                    {"session_id": row.id, "artifact_id": done.summary_id},
                )
        except BaseException:
            self.handles.pop(row.id)  # the cache may hold the compacted prompt that did not commit
            raise
        return done.summary_id

    async def _summarize_retrieval(
        self, tx: AsyncSession, engine: KVEngine, row: AgentSession, turn: int, log: list[artifacts_repo.LogEntry],
        summarized: list[LiveRow],
    ) -> tuple[str, str]:
        """Compaction in a retrieval session: a summary message derived from the older messages, which stay in the
        store (a prompt holds only what retrieval picks, so nothing needs to leave it). Its parents are its sources,
        so deleting one reaches it, and a forget regenerates it from the rest. Returns (its id, its text)."""
        sources = [
            artifacts_repo.Neighbor(r.id, r.kind, r.turn, position, r.content, r.source_ids, 0.0)
            for position, r in enumerate(summarized)
            if r.kind in retrieval.CONTEXT_KINDS
        ]
        if not sources:
            raise Conflict("nothing to summarize: the older turns hold no messages")
        preamble_ids, preamble_tokens = retrieval.preamble(log)
        answer = await retrieval.summarize(
            engine, self.handles, row.id, salt_of(row), preamble_tokens, sources,
            lambda room: sampling_for(row.sampling, turn, room),
        )
        outcome = Outcome([answer.reply], answer.reply, answer.usage, answer.finish_reason, 0, None)
        parents = RetrievedContext(preamble_ids, [m.id for m in sources])
        records = plan_records(row.tenant_id, row.id, turn, log, [answer.reply], outcome, parents)
        await self._write(tx, row, turn, records)
        summary = records.artifacts[0]
        await artifacts_repo.set_embeddings(tx, {summary["id"]: (await self.embedder.embed([summary["content"]]))[0]})
        return summary["id"], summary["content"]

    async def _auto_compact(self, tx: AsyncSession, engine: KVEngine, row: AgentSession) -> None:
        """Over the session's token budget (`compaction.max_tokens`), compact as the next transition."""
        policy = row.compaction or {}
        budget = policy.get("max_tokens")
        if not budget or row.token_count <= int(budget):
            return
        keep = int(policy.get("keep_last_turns", 2))
        live = [LiveRow.of(a) for a in await artifacts_repo.list_live(tx, row.tenant_id, row.id)]
        try:
            compaction_plan(live, keep)
        except Conflict:
            return  # everything left is kept: nothing older to fold in yet
        await self._compact_locked(tx, engine, row, keep, bool(policy.get("write_back")))

    async def _write_compaction(
        self, tx: AsyncSession, row: AgentSession, turn: int, live: list[LiveRow], done: Compaction
    ) -> None:
        await artifacts_repo.archive(tx, row.id, done.archived, turn)
        await artifacts_repo.insert_artifacts(tx, done.rows)
        await artifacts_repo.insert_edges(tx, done.edges)
        manifest = await self._manifest(tx, row.id)  # the live prompt after the compaction
        marks = checkpoints.for_transition(row.checkpoint_policy, turn, ["summary"], [], manifest)
        await sessions_repo.add_checkpoints(tx, row.id, _rows(marks))
        await sessions_repo.record_transition(tx, row.id, turns=turn, token_count=done.token_count)
        row.turns, row.token_count = turn, done.token_count

    async def _manifest(self, tx: AsyncSession, session_id: str) -> list[tuple[str, int, int]]:
        return [(e.id, e.token_start, e.token_end) for e in await artifacts_repo.load_log(tx, session_id)]

    # -- artifacts ----------------------------------------------------------------------------------------------

    async def artifacts(self, tenant_id: str, session_id: str) -> list[ArtifactView]:
        async with self.db.transaction() as tx:
            await self._require(tx, tenant_id, session_id)
            rows = await artifacts_repo.list_live(tx, tenant_id, session_id)
            parents = await artifacts_repo.parents_of(tx, session_id)
        return [ArtifactView(a, parents.get(a.id, [])) for a in rows]

    async def descendants(self, tenant_id: str, session_id: str, artifact_id: str) -> list[ArtifactView]:
        async with self.db.transaction() as tx:
            await self._require(tx, tenant_id, session_id)
            if await artifacts_repo.get(tx, tenant_id, session_id, artifact_id) is None:
                raise NotFound(f"no artifact {artifact_id!r} in session {session_id!r}")
            rows = await graph.taint_closure(tx, tenant_id, session_id, artifact_id)
            parents = await artifacts_repo.parents_of(tx, session_id, [a.id for a in rows])
        return [ArtifactView(a, parents.get(a.id, [])) for a in rows]


class StaleHead(Conflict):
    """A conditional transition (`expect_turns`) found the session moved on."""

    type_slug = "stale-head"
    title = "Session moved on"


def _reply_keep_ids(outcome: Outcome, reply_id: str | None) -> list[str | None]:
    """keep_ids for plan_records that give the reply block the id `reply_id` (nothing else keeps one)."""
    if reply_id is None or outcome.reply is None:
        return []
    index = next((i for i, b in enumerate(outcome.blocks) if b is outcome.reply), None)
    return [] if index is None else [*([None] * index), reply_id]


def _busy(session_id: str) -> SessionBusy:
    return SessionBusy(
        f"session {session_id!r} is busy (a turn or a forget is running on it); retry later",
        headers={"Retry-After": "2"},
    )


def _rows(marks: list[checkpoints.Boundary]) -> list[tuple[int, int, str]]:
    return [(b.turn, b.token_offset, b.manifest_sha256) for b in marks]


def parse_calls_json(content: str) -> list[ToolCall]:
    """A stored tool_call artifact's call (its content is the call as JSON)."""
    try:
        body = json.loads(content)
        return [ToolCall(str(body["id"]), str(body["name"]), dict(body.get("arguments") or {}))]
    except (ValueError, KeyError, TypeError):
        return []


def _result(
    turn: int, epoch: int, records: TransitionRecords, outcome: Outcome | None, calls: list[ToolCall]
) -> TurnResult:
    reply = records.reply
    return TurnResult(
        turn=turn,
        epoch=epoch,
        input_ids=records.input_ids,
        reply_id=None if reply is None else reply["id"],
        reply_content=None if reply is None else reply["content"],
        usage=Usage(0, 0, 0, 0, 0) if outcome is None else outcome.usage,
        finish_reason=None if outcome is None else outcome.finish_reason,
        tool_calls=calls,
    )
