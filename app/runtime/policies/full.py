"""The `full` context policy's transition half: a reply sees the whole log, which the engine's cache holds between
turns.

A transition catches the session's cache handle up with the log it starts from (engine_calls.sync: the stored log for a
turn, the rebuilt one for a replay), runs the transition on it with the session's tools (tool_loop.advance_with_tools),
and leaves the handle at the transition's end; a compaction replaces the older turns in the prompt with a summary
(compaction.py), so the cache then holds the compacted prompt.
"""

from __future__ import annotations

from app.db.models import AgentSession
from app.engine.protocol import TokenSink
from app.runtime.compaction import compact, summary_room
from app.runtime.engine_calls import check_room, rewind, sampling_for, sync
from app.runtime.provenance import FullContext
from app.runtime.records import TransitionRecords, stored_log
from app.runtime.routing import route_of
from app.runtime.salts import salt_of
from app.runtime.tool_loop import advance_with_tools
from app.runtime.transition import Compacted, Machinery, Replied, SessionState, TransitionInput

PROVENANCE = FullContext()


class FullTransitions:
    async def reply(
        self, m: Machinery, row: AgentSession, state: SessionState, t: TransitionInput, on_tokens: TokenSink | None
    ) -> Replied:
        engine = m.engine
        stored = stored_log(state.log)
        room = check_room(engine, len(stored.tokens), sum(len(b.token_ids) for b in t.blocks), t.generate)
        sampling = sampling_for(row.sampling, t.turn, room) if t.generate else None
        key = route_of(row)
        synced = await sync(engine, await m.handles.checkout(key), key, salt_of(row), stored)
        m.handles.keep(key, synced.handle)
        try:
            sources = frozenset(s for entry in state.log for s in entry.source_ids)
            outcome, tools = await advance_with_tools(
                engine, synced, list(t.blocks), sampling, t.tools, t.turn, sources, on_tokens,
                None if t.draft is None else list(t.draft),
            )
        except BaseException:
            # Nothing of the transition is kept; crop the handle back while the lease still keeps every other
            # transition of this session away from it. (A commit that fails after this point leaves the handle
            # ahead of the database: the caller drops it.)
            try:
                await rewind(engine, synced.handle, len(stored.tokens))
            except Exception:
                await m.handles.drop(key)  # a handle in doubt is dropped; the next turn rebuilds from the log
            raise
        return Replied(outcome, tools, PROVENANCE)

    async def compact(self, m: Machinery, row: AgentSession, state: SessionState, t: TransitionInput) -> Compacted:
        assert t.compaction is not None
        engine = m.engine
        stored = stored_log(state.log)
        room = summary_room(engine, len(stored.tokens))
        key = route_of(row)
        synced = await sync(engine, await m.handles.checkout(key), key, salt_of(row), stored)
        m.handles.keep(key, synced.handle)
        try:
            done = await compact(
                engine, synced, t.compaction.live, tenant_id=row.tenant_id, session_id=row.id, turn=t.turn,
                sampling=sampling_for(row.sampling, t.turn, room), keep_last_turns=t.compaction.keep_last_turns,
                next_position=state.next_position, draft=None if t.draft is None else list(t.draft),
            )
        except BaseException:
            await m.handles.drop(key)  # the cache may hold part of the compacted prompt
            raise
        head = [(e.id, e.token_start, e.token_end) for e in state.log if e.turn == 0]
        after = [*head, *((r["id"], r["token_start"], r["token_end"]) for r in done.rows)]
        records = TransitionRecords(done.rows, done.edges, ["summary"], [], after, done.token_count)
        assert done.usage is not None
        return Compacted(records, done.archived, done.usage, None, done.summary_id, done.summary)
