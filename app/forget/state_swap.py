"""Swapping a strategy's change into a session, and the session's receipt entry that says what changed.

The writes are the repository's (forget/repositories/swap.py) and, for a replay, the runtime's writer of a turn
(runtime/writes.py); here the change is translated for them, the state is digested before and after, and the cache
salt rotated when the forget left blocks a later request could reach.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AgentSession, Artifact
from app.forget.closure import ClosureEntry
from app.forget.cost import Yardstick
from app.forget.locate import Found, Located
from app.forget.per_policy import ForgetPolicy
from app.forget.receipts import RestorePoint, SessionEntry, TokenCounts, TraceEntry, state_sha256
from app.forget.replay import Rebuilt
from app.forget.repositories.swap import InPlace, Swapped, record_swap, rewrite_in_place
from app.forget.session_work import Change
from app.keys.content import Sealer
from app.runtime.writes import write_step
from app.sessions.repositories import artifacts as artifacts_repo
from app.sessions.repositories import sessions as sessions_repo
from app.sessions.repositories import tools as tools_repo
from app.sessions.repositories.artifacts import Retired
from app.sessions.repositories.suffix import clear_suffix


def session_entry(
    session: AgentSession, located: Located, closure: Sequence[ClosureEntry], tokens: TokenCounts, *,
    transitions_replayed: int = 0, checkpoint: RestorePoint | None = None, trace: list[TraceEntry] | None = None,
    epoch_after: int | None = None, state_before: str | None = None, state_after: str | None = None,
) -> SessionEntry:
    """A receipt's (or a plan's) entry for one session: where the target sat, what it reached, what it cost."""
    return SessionEntry(
        session_id=session.id, tau=located.tau, T=session.turns, transitions_replayed=transitions_replayed,
        checkpoint=checkpoint, closure=[entry.artifact_id for entry in closure], trace=trace, tokens=tokens,
        epoch_before=session.epoch, epoch_after=epoch_after, state_sha256_before=state_before,
        state_sha256_after=state_after,
    )


async def swap_in(
    tx: AsyncSession, sealer: Sealer, session: AgentSession, found: Found, change: Change, policy: ForgetPolicy,
    yardstick: Yardstick,
) -> tuple[SessionEntry, Retired]:
    """Write `change` in the session's transaction and return the session's receipt entry, its costs measured with
    the engine's `yardstick`, and what the swap retired from the store (leaves to shred once it committed)."""
    rows = found.live_rows  # the live state (archived originals are history)
    before = _digest(rows)
    log_before = [t for r in sorted(rows, key=lambda r: r.position) for t in r.token_ids]
    # Read before any write: the swap updates the session row, and with it this object.
    entry = session_entry(
        session, found.located, found.closure,
        TokenCounts(
            reused=0, prefilled=0, decoded=0, full_reset_estimate=yardstick.run(session.token_count, rows)
        ),
        epoch_after=session.epoch, state_before=before, state_after=before,
    )
    if change is None:
        return entry, Retired()
    epoch = session.epoch + 1
    checkpoint = None
    if isinstance(change, Rebuilt):
        turns = max([session.turns, *(r["turn"] for r in change.rows)])
        restore = change.restored_from
        if restore is not None and restore.turn >= 0:
            checkpoint = RestorePoint(turn=restore.turn, token_offset=restore.token_offset)
    else:
        turns = session.turns
    if isinstance(change, Rebuilt):
        retired = await clear_suffix(tx, session.id, change.from_turn)
        for rebuilt in change.steps:  # the turn's own writer, transition by transition
            await write_step(tx, sealer, session.id, rebuilt)
        if session.tools:
            await tools_repo.link_checkpoints(tx, session.id, max(0, change.from_turn - 1))
    else:
        retired = await rewrite_in_place(tx, sealer, session.id, InPlace(
            deleted=change.deleted, updated=change.updated, inserted=change.inserted, edges=change.edges,
            first_turn=change.first_turn,
        ))
    swapped = Swapped(epoch, turns, change.token_count, change.system_prompt)
    retired = retired.add(await record_swap(tx, sealer, session, swapped))  # a rewritten system prompt's old leaf
    after = await artifacts_repo.list_live(tx, sealer, session.tenant_id, session.id)
    if policy.rotates_salt(log_before, [t for r in after for t in r.token_ids]):
        # The forgotten blocks stay in vLLM's prefix cache until evicted: no request of this session may reach them.
        await sessions_repo.bump_cache_generation(tx, session.id)
    tokens = TokenCounts(
        reused=change.reused, prefilled=change.prefilled, decoded=change.decoded, verified=change.verified,
        full_reset_estimate=yardstick.run(after[-1].token_end if after else 0, after),
    )
    return entry.model_copy(update={
        "tokens": tokens, "transitions_replayed": change.transitions, "checkpoint": checkpoint, "epoch_after": epoch,
        "state_sha256_after": _digest(after), "replay_modes": dict(change.modes),
    }), retired


def _digest(rows: Sequence[Artifact]) -> str:
    return state_sha256((r.kind, r.turn, r.token_ids) for r in rows)
