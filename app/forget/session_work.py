"""What a strategy works on: one session, under its lease, with the target located and its closure known."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.db.models import AgentSession, Artifact, Checkpoint
from app.forget.closure import ClosureEntry
from app.forget.locate import Located
from app.forget.replay import Rebuilt
from app.forget.rewrite import Rewritten
from app.runtime.tool_loop import ReplayTools, ToolContext
from app.runtime.transition import Machinery, SessionPolicy
from app.sessions.repositories import tools as tools_repo

# What a strategy does to a session, swapped in by the executor: transitions replaced, artifacts rewritten in
# place, or nothing.
Change = Rebuilt | Rewritten | None


@dataclass(frozen=True)
class SessionWork:
    # Short read transactions of what the strategy needs (under the lease nothing else writes the session); the
    # strategy writes nothing: the executor swaps its change in.
    m: Machinery  # the engine, cache handles, embedder and database transitions run on
    policy: SessionPolicy  # the session's context policy: a replay's transitions run through it (runtime/transition.py)
    session: AgentSession
    rows: list[Artifact]
    located: Located
    closure: list[ClosureEntry]
    checkpoints: list[Checkpoint]
    provided: dict[str, str] = field(default_factory=dict)  # the client's answers to calls a replay made anew
    similar: list[str] = field(default_factory=list)  # semantic_deletion: every artifact matching the query

    @property
    def live_rows(self) -> list[Artifact]:
        """The live prompt (`rows` also holds what compactions archived, which a replay needs)."""
        return [r for r in self.rows if r.archived_by is None]

    async def tools_before(self, turn: int) -> ToolContext | None:
        """The session's tools for a replay from `turn`: the environment as snapshotted before it, the ledger of
        fired calls, and the original run's results (A3: identical calls reuse them)."""
        if not self.session.tools:
            return None
        async with self.m.db.transaction() as tx:
            _, env = await tools_repo.environment(tx, self.m.sealer, self.session.id, before_turn=turn)
            fired = await tools_repo.fired(tx, self.session.id)
        recorded = {
            str(r.meta["tool_call_id"]): r.content
            for r in self.rows
            if r.kind == "tool_result" and (r.meta or {}).get("tool_call_id")
        }
        calls = {str(r.meta.get("tool_call_id")) for r in self.rows if r.kind == "tool_call" and r.meta}
        replay = ReplayTools(recorded=recorded, original_calls=calls, provided=dict(self.provided))
        return ToolContext(
            self.session.id, self.session.tools, env, fired, frozenset(self.session.flagged_sources), replay
        )
