"""The `full` context policy: a reply sees the whole log, which the engine's cache holds between turns.

A turn catches this process's cache handle up with the stored log (transition.sync), runs the transition on it with
the session's tools, and writes it; a compaction replaces the older turns in the prompt with a summary
(runtime/compaction.py), so the cache then holds the compacted prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AgentSession
from app.db.repositories import artifacts as artifacts_repo
from app.db.repositories import tools as tools_repo
from app.engine.protocol import TokenSink
from app.runtime.blocks import Block
from app.runtime.compaction import LiveRow, compact, summary_room
from app.runtime.context import ContextPolicy, FullContext
from app.runtime.records import records_for, stored_log
from app.runtime.salts import route_of, salt_of
from app.runtime.tooling import ToolContext, advance_with_tools
from app.runtime.transition import check_room, rewind, sampling_for, sync
from app.sessions.policies.base import Summary, Transition, TurnRun, reply_keep_ids
from app.sessions.writes import write_compaction, write_transition


class FullTurns:
    name: str = "full"
    context: ContextPolicy = FullContext()

    async def run_turn(
        self, t: Transition, blocks: list[Block], generate: bool, on_tokens: TokenSink | None, reply_id: str | None
    ) -> TurnRun:
        engine, row = t.engine, t.row
        stored = stored_log(t.log)
        room = check_room(engine, len(stored.tokens), sum(len(b.token_ids) for b in blocks), generate)
        sampling = sampling_for(row.sampling, t.turn, room) if generate else None
        async with t.db.transaction() as tx:
            tools = await _tool_context(tx, row)
        synced = await sync(engine, t.handles.get(row.id), route_of(row), salt_of(row), stored)
        t.handles.put(row.id, synced.handle)
        try:
            sources = frozenset(s for entry in t.log for s in entry.source_ids)
            outcome, step = await advance_with_tools(
                engine, synced, blocks, sampling, tools, t.turn, sources, on_tokens
            )
        except BaseException:
            # Nothing of the transition is written; crop the handle back while the lease still keeps every other
            # turn of this session away from it. (A commit that fails after this point leaves the handle ahead of
            # the database: the caller drops it.)
            try:
                await rewind(engine, synced.handle, len(stored.tokens))
            except Exception:
                t.handles.pop(row.id)  # a handle in doubt is dropped; the next turn rebuilds from the database
            raise
        records = records_for(
            row.tenant_id, row.id, t.turn, t.log, outcome.blocks, outcome, self.context,
            reply_keep_ids(outcome, reply_id),
        )

        async def write(tx: AsyncSession, locked: AgentSession) -> None:
            await write_transition(tx, locked, t.turn, records)
            if tools is not None:
                await tools_repo.record_fired(tx, locked.id, step.fired_now)
                if step.env_changed:
                    await tools_repo.save_environment(tx, locked.id, t.turn, tools.env)
                await tools_repo.link_checkpoints(tx, locked.id, t.turn - 1)

        return TurnRun(outcome, records, step, write)

    async def compact(self, t: Transition, live: Sequence[LiveRow], keep_last_turns: int) -> Summary:
        engine, row = t.engine, t.row
        stored = stored_log(t.log)
        room = summary_room(engine, len(stored.tokens))
        async with t.db.transaction() as tx:
            next_position = await artifacts_repo.max_position(tx, row.id) + 1
        synced = await sync(engine, t.handles.get(row.id), route_of(row), salt_of(row), stored)
        t.handles.put(row.id, synced.handle)
        try:
            done = await compact(
                engine, synced, live, tenant_id=row.tenant_id, session_id=row.id, turn=t.turn,
                sampling=sampling_for(row.sampling, t.turn, room), keep_last_turns=keep_last_turns,
                next_position=next_position,
            )
        except BaseException:
            t.handles.pop(row.id)  # the cache may hold part of the compacted prompt
            raise

        async def write(tx: AsyncSession, locked: AgentSession) -> None:
            await write_compaction(tx, locked, t.turn, done)

        return Summary(done.summary_id, done.summary, write)


async def _tool_context(tx: AsyncSession, row: AgentSession) -> ToolContext | None:
    if not row.tools:
        return None
    _, env = await tools_repo.environment(tx, row.id)
    fired = await tools_repo.fired(tx, row.id)
    return ToolContext(row.id, row.tools, env, fired, frozenset(row.flagged_sources))
