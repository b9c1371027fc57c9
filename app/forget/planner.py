"""Dry runs: what a forget would do, per session, without doing it.

Per session τ, the closure with why each artifact is in it, the restore point and the expected cost against a full
reset. Reads only (a query target's observation embeddings are computed and kept). A `planned` job (a deletion
request in plain words, proposals.py) stores such a plan for the client to confirm.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.db.database import Database
from app.db.models import AgentSession, Checkpoint
from app.embeddings import Embedder
from app.forget import locate
from app.forget.cost import Yardstick
from app.forget.jobs import JobView
from app.forget.locate import Found, Target
from app.forget.per_policy import ForgetLookup
from app.forget.receipts import MemoryEntry, SessionEntry, TokenCounts, TraceEntry
from app.forget.state_swap import session_entry
from app.forget.strategies import ForgetStrategy
from app.forget.target_sessions import check_session
from app.ids import new_id
from app.keys.content import Sealer
from app.sessions.repositories import sessions as sessions_repo


async def plan(
    db: Database, sealer: Sealer, embedder: Embedder, tenant_id: str, target: Target, strategy: ForgetStrategy,
    session_ids: Sequence[str], reason: str | None, policies: ForgetLookup, yardstick: Yardstick,
) -> JobView:
    """The dry run of forgetting `target` with `strategy` in `session_ids`, its costs measured with `yardstick`."""
    entries = []
    for session_id in session_ids:
        vector = None
        if target.query is not None:
            vector = await locate.embed_query(db, sealer, embedder, session_id, target.query)
        async with db.transaction() as tx:
            session = await sessions_repo.get(tx, sealer, tenant_id, session_id)
            if session is None:
                continue
            found = await locate.find(tx, sealer, session, target, vector)
            if found is None:
                continue
            check_session(strategy, session, policies)
            strategy.check(found.located)
            checkpoints = await sessions_repo.checkpoints(tx, tenant_id, session_id)
        entries.append(_planned(session, found, checkpoints, strategy, policies, yardstick))
    memory = None
    if target.namespace is not None:
        assert target.key is not None
        memory = MemoryEntry(namespace=target.namespace, key=target.key, tombstone_version=None)
    return JobView(
        id=new_id("fgt"), status="succeeded", strategy=strategy.name, target=target.scrubbed(), sessions=entries,
        memory=memory, reason=reason, dry_run=True,
    )


def _planned(
    session: AgentSession, found: Found, checkpoints: Sequence[Checkpoint], strategy: ForgetStrategy,
    policies: ForgetLookup, yardstick: Yardstick,
) -> SessionEntry:
    trace = [TraceEntry(artifact_id=e.artifact_id, kind=e.kind, turn=e.turn, why=e.why) for e in found.closure]
    full = yardstick.run(session.token_count, found.live_rows)
    if not strategy.replays:  # nothing regenerated: the change costs next to nothing
        tokens = TokenCounts(reused=0, recompute_estimate=0, full_reset_estimate=full)
        return session_entry(session, found.located, found.closure, tokens, trace=trace)
    estimate = policies.of(session).forget.estimate(
        session, found.rows, found.located, found.closure, checkpoints, yardstick, cold=strategy.cold
    )
    tokens = TokenCounts(
        reused=estimate.reused, recompute_estimate=estimate.recompute_estimate, full_reset_estimate=full
    )
    return session_entry(
        session, found.located, found.closure, tokens, transitions_replayed=estimate.transitions_replayed,
        checkpoint=estimate.checkpoint, trace=trace,
    )
