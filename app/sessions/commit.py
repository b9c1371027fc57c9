"""Committing transitions: one transition is one unit of work under the session's lease.

Lease the session (locking.py), read the stored log, run the transition with the runtime's one transition function
(runtime/transition.py, under the session's policy object) with no transaction open, then write what it computed
with the runtime's one writer (runtime/writes.py) and the session's counters in one transaction that commits only
while the lease is still this request's. The lease serializes turns on one session across every API process on the
database; if the model call fails nothing is written and the session's cache handle is put back before the lease is
released.

Transition 0 is the system block and the injected memory records, written at creation without an engine call (the
first turn prefills them in a call of their own, and a replay does the same, see runtime/engine_calls.py). Transition t
(t ≥ 1) is the t-th POST of turns; a compaction is a transition too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AgentSession
from app.engine.protocol import TokenSink
from app.errors import Conflict, InvalidRequest
from app.keys.content import Sealer
from app.memory.in_transaction import write_summary_in
from app.runtime.blocks import Observation, render
from app.runtime.compaction import DEFAULT_KEEP_LAST_TURNS, LiveRow, split_older
from app.runtime.routing import route_of
from app.runtime.tool_loop import ToolContext
from app.runtime.transition import Compaction, Machinery, PolicyLookup, SessionState, Step, TransitionInput, step
from app.runtime.writes import write_step
from app.sessions.locking import Lease, SessionLocks
from app.sessions.repositories import artifacts as artifacts_repo
from app.sessions.repositories import sessions as sessions_repo
from app.sessions.repositories import tools as tools_repo
from app.sessions.repositories.artifacts import ErasedLog
from app.sessions.repositories.suffix import clear_suffix
from app.sessions.views import StaleHead, TurnResult
from app.tool_calls import ToolCall

log = logging.getLogger(__name__)

# What a caller writes about a transition in the transaction that commits it (SessionService.turn).
OnCommit = Callable[[AsyncSession, TurnResult], Awaitable[None]]


class Transitions:
    def __init__(self, locks: SessionLocks, policies: PolicyLookup, sealer: Sealer) -> None:
        self.locks = locks
        self.policies = policies
        self.sealer = sealer  # the session's content is opened and sealed with it, a summary written back to memory too

    async def turn(
        self,
        m: Machinery,
        tenant_id: str,
        session_id: str,
        observations: Sequence[Observation],
        generate: bool,
        on_tokens: TokenSink | None,
        *,
        sampling: Mapping[str, Any] | None,
        expect_turns: int | None,
        reply_id: str | None,
        on_commit: OnCommit | None = None,
    ) -> TurnResult:
        """One transition (SessionService.turn). An empty one (no observation, no reply) is bookkeeping only: it
        never touches `m.engine`, so it works while the model loads."""
        empty = not observations and not generate
        blocks = [] if empty else [render(m.engine.chat, o) for o in observations]
        async with self.locks.leased(tenant_id, session_id, "running") as lease:
            state = await self._readable_state(m, lease)
            row = lease.row
            if expect_turns is not None and row.turns != expect_turns:
                raise StaleHead(f"session {session_id!r} moved on: {row.turns} transitions, expected {expect_turns}")
            turn = row.turns + 1
            if sampling and not empty:
                per_turn = {**(row.sampling.get("per_turn") or {}), str(turn): dict(sampling)}
                row.sampling = {**row.sampling, "per_turn": per_turn}  # what this transition samples with
            async with lease.reads() as tx:
                answered = await _check_tool_results(tx, self.sealer, row, observations)
                tools = None if empty else await _tool_context(tx, self.sealer, row)
            t = TransitionInput(turn, blocks, generate, reply_id=reply_id, tools=tools)
            done = await step(m, row, self.policies.of(row), state, t, on_tokens)
            async with self._committing(m, lease) as (tx, locked):
                if row.sampling != locked.sampling:
                    await sessions_repo.set_sampling(tx, locked.id, row.sampling)
                await _write(tx, self.sealer, locked, done)
                await _commit_client_calls(tx, self.sealer, locked, answered)
                if on_commit is not None:
                    await on_commit(tx, _result(locked.epoch, done))
            if not empty:
                await self._compact_after(lease, m)
        return _result(lease.row.epoch, done)

    async def compact(
        self, m: Machinery, tenant_id: str, session_id: str, *, keep_last_turns: int, write_back: bool
    ) -> tuple[AgentSession, str]:
        """A compaction transition (SessionService.compact): the session row after it, and the summary's id."""
        async with self.locks.leased(tenant_id, session_id, "running") as lease:
            summary_id = await self._compact_leased(lease, m, keep_last_turns, write_back)
        return lease.row, summary_id

    async def _compact_leased(self, lease: Lease, m: Machinery, keep_last_turns: int, write_back: bool) -> str:
        """The compaction transition, under the caller's lease."""
        if write_back and lease.row.memory_namespace is None:
            raise Conflict("write_back needs the session's memory_namespace")
        state = await self._readable_state(m, lease)
        row = lease.row
        async with lease.reads() as tx:
            live = [LiveRow.of(a) for a in await artifacts_repo.list_live(tx, self.sealer, row.tenant_id, row.id)]
        split_older(live, keep_last_turns)  # 409 before any model work: nothing to compact
        t = TransitionInput(row.turns + 1, compaction=Compaction(keep_last_turns, live))
        done = await step(m, row, self.policies.of(row), state, t)
        assert done.summary is not None
        summary_id, summary = done.summary
        async with self._committing(m, lease) as (tx, locked):
            await _write(tx, self.sealer, locked, done)
            if write_back:
                assert locked.memory_namespace is not None
                await write_summary_in(
                    tx, self.sealer, locked.tenant_id, locked.memory_namespace, f"summary.{locked.id}", summary,
                    {"session_id": locked.id, "artifact_id": summary_id},
                )
        return summary_id

    async def _readable_state(self, m: Machinery, lease: Lease) -> SessionState:
        """The session's live prompt as stored. In a database restored from a backup taken before a forget, the log
        can hold what that forget erased, its keys shredded since (docs/erasure-at-rest.md): the session then resumes
        from the last transition before the first erased one, as a forget's replay starts from its checkpoint. The
        unreadable suffix is dropped (it can never be read again), the epoch moves on (clients see a rewritten
        state) and so does the cache salt (no request reaches blocks the engine cached from that suffix)."""
        async with lease.reads() as tx:
            try:
                return await _state(tx, self.sealer, lease.row)
            except ErasedLog as erased:
                first = erased.turn
        async with self._committing(m, lease) as (tx, locked):
            await clear_suffix(tx, locked.id, first)
            locked.turns = max(first - 1, 0)
            locked.token_count = await artifacts_repo.token_end(tx, locked.id)
            locked.epoch += 1
            locked.cache_generation += 1
        await m.handles.drop(route_of(lease.row))
        log.warning("session resumed before an erased transition",
                    extra={"session_id": lease.row.id, "turn": first, "epoch": lease.row.epoch})
        async with lease.reads() as tx:
            return await _state(tx, self.sealer, lease.row)

    @asynccontextmanager
    async def _committing(self, m: Machinery, lease: Lease) -> AsyncIterator[tuple[AsyncSession, AgentSession]]:
        """The lease's commit; if it does not happen, the session's cache handle may be ahead of the database (it
        holds the transition's tokens), so it is dropped and the next turn rebuilds it."""
        try:
            async with lease.commit() as held:
                yield held
        except BaseException:
            await m.handles.drop(route_of(lease.row))
            raise

    async def _compact_after(self, lease: Lease, m: Machinery) -> None:
        """The turn is committed: its auto-compaction (housekeeping under the same lease) must not change how the
        turn is answered. A client hanging up meanwhile does not cancel it (the turn happened: its request ends as
        a success, not 499), and a compaction that fails leaves the turn answered (the next turn tries again)."""
        compaction = asyncio.ensure_future(self._auto_compact(lease, m))
        try:
            try:
                await asyncio.shield(compaction)
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None:
                    current.uncancel()
                await compaction  # to its end; a second cancellation (a shutdown) is not swallowed
        except Exception:
            log.exception("auto-compaction failed after a committed turn", extra={"session_id": lease.row.id})

    async def _auto_compact(self, lease: Lease, m: Machinery) -> None:
        """Over the session's token budget (`compaction.max_tokens`), compact as the next transition, under the
        same lease."""
        row = lease.row
        config = row.compaction or {}
        budget = config.get("max_tokens")
        if not budget or row.token_count <= int(budget):
            return
        keep = int(config.get("keep_last_turns", DEFAULT_KEEP_LAST_TURNS))
        async with lease.reads() as tx:
            live = [LiveRow.of(a) for a in await artifacts_repo.list_live(tx, self.sealer, row.tenant_id, row.id)]
        try:
            split_older(live, keep)
        except Conflict:
            return  # everything left is kept: nothing older to fold in yet
        await self._compact_leased(lease, m, keep, bool(config.get("write_back")))


async def _state(tx: AsyncSession, sealer: Sealer, row: AgentSession) -> SessionState:
    """The session's live prompt as stored: where its next transition starts."""
    log = await artifacts_repo.load_log(tx, sealer, row.id)
    return SessionState(log, await artifacts_repo.max_position(tx, row.id) + 1)


async def _tool_context(tx: AsyncSession, sealer: Sealer, row: AgentSession) -> ToolContext | None:
    if not row.tools:
        return None
    _, env = await tools_repo.environment(tx, sealer, row.id)
    fired = await tools_repo.fired(tx, row.id)
    return ToolContext(row.id, row.tools, env, fired, frozenset(row.flagged_sources))


async def _write(tx: AsyncSession, sealer: Sealer, locked: AgentSession, done: Step) -> None:
    """A committed transition: what it computed, its checkpoints' tool environments, the session's counters."""
    await write_step(tx, sealer, locked.id, done)
    if locked.tools:
        await tools_repo.link_checkpoints(tx, locked.id, done.turn - 1)
    await sessions_repo.record_transition(tx, locked.id, turns=done.turn, token_count=done.records.token_count)
    locked.turns, locked.token_count = done.turn, done.records.token_count


async def _check_tool_results(
    tx: AsyncSession, sealer: Sealer, row: AgentSession, observations: Sequence[Observation]
) -> list[str]:
    """In a session with tools, a tool_result must answer one of its pending calls (422 otherwise); returns the
    ids answered. A session without tools takes any tool_result: the client runs its own tool loop."""
    ids = [o.meta.get("tool_call_id", "") for o in observations if o.kind == "tool_result"]
    if not row.tools or not ids:
        return []
    pending = {(a.meta or {}).get("tool_call_id") for a in await artifacts_repo.pending_calls(tx, sealer, row.id)}
    unknown = [i for i in ids if i not in pending]
    if unknown or len(set(ids)) != len(ids):
        raise InvalidRequest(f"tool_result answers no pending tool call of this session: {sorted(set(unknown))}")
    return ids


async def _commit_client_calls(tx: AsyncSession, sealer: Sealer, row: AgentSession, answered: list[str]) -> None:
    """A client's answer to a consequential call of its own is the call having fired: mark it and record it in the
    ledger, so a replay never asks for it again."""
    consequential = {t["name"] for t in row.tools if t.get("kind") == "consequential" and not t.get("builtin")}
    calls = [
        ToolCall(str(a.meta["tool_call_id"]), a.meta.get("name", ""), {})
        for a in await artifacts_repo.tool_calls(tx, sealer, row.id, answered)
        if (a.meta or {}).get("name") in consequential
    ]
    if calls:
        await artifacts_repo.mark_committed(tx, row.id, [c.id for c in calls])
        await tools_repo.record_fired(tx, row.id, calls)


def _result(epoch: int, done: Step) -> TurnResult:
    reply = done.reply
    return TurnResult(
        turn=done.turn,
        epoch=epoch,
        input_ids=done.records.input_ids,
        reply_id=None if reply is None else reply["id"],
        reply_content=None if reply is None else reply["content"],
        usage=done.usage,
        finish_reason=done.finish_reason,
        tool_calls=done.tools.calls,
    )
