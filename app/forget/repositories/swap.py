"""A forget's swap: the writes that replace a session's contaminated state with its rebuilt one.

Run in the commit of the session's lease (the row locked, the lease checked), after the rebuilt state was computed
aside; everything here commits with the job's receipt entry or not at all. Two shapes: a suffix of transitions
replaced (a replay: `clear_suffix` from app/sessions/repositories/suffix.py, then each rebuilt transition written by
the runtime's writer of a turn, runtime/writes.py), or artifacts rewritten in place (deleted, updated, inserted: a
rewrite or a retrieval session's regeneration).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AgentSession
from app.keys.content import Sealer
from app.sessions.repositories import artifacts as artifacts_repo
from app.sessions.repositories import sessions as sessions_repo
from app.sessions.repositories.artifacts import Retired


@dataclass(frozen=True)
class InPlace:
    """Artifacts deleted, updated and inserted; ids and positions of the rest kept."""

    deleted: Sequence[str]
    updated: Sequence[dict[str, Any]]
    inserted: Sequence[dict[str, Any]]
    edges: Sequence[dict[str, Any]]
    first_turn: int | None  # the first transition touched: its checkpoints and later ones are stale


@dataclass(frozen=True)
class Swapped:
    epoch: int
    turns: int
    token_count: int
    system_prompt: str | None


async def rewrite_in_place(tx: AsyncSession, sealer: Sealer, session_id: str, change: InPlace) -> Retired:
    """The change written; what it retired (deleted artifacts, and the old text of rewritten ones) to shred."""
    retired = await artifacts_repo.delete_ids(tx, session_id, change.deleted)  # their edges go with them
    retired = retired.add(await artifacts_repo.rewrite(tx, sealer, session_id, change.updated))
    await artifacts_repo.insert_artifacts(tx, sealer, change.inserted)  # sealed under fresh leaves
    await artifacts_repo.insert_edges(tx, change.edges)
    if change.first_turn is not None:
        # Manifests from the first edited transition on name spans that changed: those checkpoints are gone.
        await sessions_repo.delete_checkpoints_from(tx, session_id, change.first_turn)
    return retired


async def record_swap(tx: AsyncSession, sealer: Sealer, session: AgentSession, state: Swapped) -> Retired:
    """The session row's new state; what it retired (the old settings' leaf when the system prompt changed)."""
    return await sessions_repo.record_forget(
        tx, sealer, session, epoch=state.epoch, turns=state.turns, token_count=state.token_count,
        system_prompt=state.system_prompt,
    )
