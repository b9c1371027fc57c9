"""Committing transitions: one transition is one unit of work under the session's lease.

Lease the session (locking.py), read the stored log, run F on the engine under the session's context policy
(policies/) with no transaction open, then write its artifacts, provenance edges, checkpoints and the session's
counters in one transaction that commits only while the lease is still this request's. The lease serializes turns on
one session across every API process on the database; if the model call fails nothing is written and this process's
cache handle is put back before the lease is released.

Transition 0 is the system block and the injected memory records, written at creation without an engine call (the
first turn prefills them in a call of their own, and a replay does the same, see runtime/transition.py). Transition t
(t ≥ 1) is the t-th POST of turns; a compaction is a transition too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AgentSession
from app.db.repositories import artifacts as artifacts_repo
from app.db.repositories import sessions as sessions_repo
from app.db.repositories import tools as tools_repo
from app.embeddings import Embedder
from app.engine.protocol import KVEngine, TokenSink
from app.errors import Conflict, InvalidRequest
from app.memory.service import write_summary_in
from app.runtime.blocks import Observation, render
from app.runtime.compaction import DEFAULT_KEEP_LAST_TURNS, LiveRow, split_older
from app.runtime.handles import HandleRegistry
from app.runtime.records import TransitionRecords, records_for
from app.runtime.transition import Usage
from app.sessions.locking import Lease, SessionLocks
from app.sessions.policies import policy_of
from app.sessions.policies.base import Transition, TurnRun, Write
from app.sessions.views import StaleHead, TurnResult
from app.sessions.writes import write_transition
from app.tool_calls import ToolCall


class Transitions:
    def __init__(self, locks: SessionLocks, handles: HandleRegistry, embedder: Embedder) -> None:
        self.locks = locks
        self.handles = handles
        self.embedder = embedder

    async def turn(
        self,
        engine: KVEngine | None,
        tenant_id: str,
        session_id: str,
        observations: Sequence[Observation],
        generate: bool,
        on_tokens: TokenSink | None,
        *,
        sampling: Mapping[str, Any] | None,
        expect_turns: int | None,
        reply_id: str | None,
    ) -> TurnResult:
        """One transition (SessionService.turn); `engine` None: an empty transition, bookkeeping only."""
        blocks = [] if engine is None else [render(engine.chat, o) for o in observations]
        async with self.locks.leased(tenant_id, session_id, "running") as lease:
            row = lease.row
            if expect_turns is not None and row.turns != expect_turns:
                raise StaleHead(f"session {session_id!r} moved on: {row.turns} transitions, expected {expect_turns}")
            turn = row.turns + 1
            if sampling and engine is not None:
                per_turn = {**(row.sampling.get("per_turn") or {}), str(turn): dict(sampling)}
                row.sampling = {**row.sampling, "per_turn": per_turn}  # what this transition samples with
            async with lease.reads() as tx:
                answered = await _check_tool_results(tx, row, observations)
                log = await artifacts_repo.load_log(tx, session_id)
            policy = policy_of(row)
            run = None
            write: Write
            if engine is None:
                records = records_for(tenant_id, session_id, turn, log, [], None, policy.context)

                async def write_empty(tx: AsyncSession, locked: AgentSession) -> None:
                    await write_transition(tx, locked, turn, records)

                write = write_empty
            else:
                t = Transition(lease.db, row, turn, log, engine, self.handles, self.embedder)
                run = await policy.run_turn(t, blocks, generate, on_tokens, reply_id)
                records, write = run.records, run.write
            async with self._committing(lease) as (tx, locked):
                if row.sampling != locked.sampling:
                    await sessions_repo.set_sampling(tx, locked.id, row.sampling)
                await write(tx, locked)
                await _commit_client_calls(tx, locked, answered)
            if engine is not None:
                await self._auto_compact(lease, engine)
        return _result(turn, lease.row.epoch, records, run)

    async def compact(
        self, engine: KVEngine, tenant_id: str, session_id: str, *, keep_last_turns: int, write_back: bool
    ) -> tuple[AgentSession, str]:
        """A compaction transition (SessionService.compact): the session row after it, and the summary's id."""
        async with self.locks.leased(tenant_id, session_id, "running") as lease:
            summary_id = await self._compact_leased(lease, engine, keep_last_turns, write_back)
        return lease.row, summary_id

    async def _compact_leased(self, lease: Lease, engine: KVEngine, keep_last_turns: int, write_back: bool) -> str:
        """The compaction transition, under the caller's lease."""
        row = lease.row
        if write_back and row.memory_namespace is None:
            raise Conflict("write_back needs the session's memory_namespace")
        async with lease.reads() as tx:
            log = await artifacts_repo.load_log(tx, row.id)
            live = [LiveRow.of(a) for a in await artifacts_repo.list_live(tx, row.tenant_id, row.id)]
        split_older(live, keep_last_turns)  # 409 before any model work: nothing to compact
        t = Transition(lease.db, row, row.turns + 1, log, engine, self.handles, self.embedder)
        summary = await policy_of(row).compact(t, live, keep_last_turns)
        async with self._committing(lease) as (tx, locked):
            await summary.write(tx, locked)
            if write_back:
                assert locked.memory_namespace is not None
                await write_summary_in(
                    tx, locked.tenant_id, locked.memory_namespace, f"summary.{locked.id}", summary.text,
                    {"session_id": locked.id, "artifact_id": summary.artifact_id},
                )
        return summary.artifact_id

    @asynccontextmanager
    async def _committing(self, lease: Lease) -> AsyncIterator[tuple[AsyncSession, AgentSession]]:
        """The lease's commit; if it does not happen, this process's cache handle may be ahead of the database
        (it holds the transition's tokens), so it is dropped and the next turn rebuilds it."""
        try:
            async with lease.commit() as held:
                yield held
        except BaseException:
            self.handles.pop(lease.row.id)
            raise

    async def _auto_compact(self, lease: Lease, engine: KVEngine) -> None:
        """Over the session's token budget (`compaction.max_tokens`), compact as the next transition, under the
        same lease."""
        row = lease.row
        config = row.compaction or {}
        budget = config.get("max_tokens")
        if not budget or row.token_count <= int(budget):
            return
        keep = int(config.get("keep_last_turns", DEFAULT_KEEP_LAST_TURNS))
        async with lease.reads() as tx:
            live = [LiveRow.of(a) for a in await artifacts_repo.list_live(tx, row.tenant_id, row.id)]
        try:
            split_older(live, keep)
        except Conflict:
            return  # everything left is kept: nothing older to fold in yet
        await self._compact_leased(lease, engine, keep, bool(config.get("write_back")))


async def _check_tool_results(tx: AsyncSession, row: AgentSession, observations: Sequence[Observation]) -> list[str]:
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


async def _commit_client_calls(tx: AsyncSession, row: AgentSession, answered: list[str]) -> None:
    """A client's answer to a consequential call of its own is the call having fired: mark it and record it in the
    ledger, so a replay never asks for it again."""
    consequential = {t["name"] for t in row.tools if t.get("kind") == "consequential" and not t.get("builtin")}
    calls = [
        ToolCall(str(a.meta["tool_call_id"]), a.meta.get("name", ""), {})
        for a in await artifacts_repo.tool_calls(tx, row.id, answered)
        if (a.meta or {}).get("name") in consequential
    ]
    if calls:
        await artifacts_repo.mark_committed(tx, row.id, [c.id for c in calls])
        await tools_repo.record_fired(tx, row.id, calls)


def _result(turn: int, epoch: int, records: TransitionRecords, run: TurnRun | None) -> TurnResult:
    reply = records.reply
    return TurnResult(
        turn=turn,
        epoch=epoch,
        input_ids=records.input_ids,
        reply_id=None if reply is None else reply["id"],
        reply_content=None if reply is None else reply["content"],
        usage=Usage(0, 0, 0, 0, 0) if run is None else run.outcome.usage,
        finish_reason=None if run is None else run.outcome.finish_reason,
        tool_calls=[] if run is None else run.step.calls,
    )
