"""Clearing a session's suffix of transitions: what a forget's replay replaces, and what a session resumed from
before an erased transition drops (app/sessions/commit.py)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from app.sessions.repositories import artifacts as artifacts_repo
from app.sessions.repositories import sessions as sessions_repo
from app.sessions.repositories import tools as tools_repo
from app.sessions.repositories.artifacts import Retired


async def clear_suffix(tx: AsyncSession, session_id: str, from_turn: int) -> Retired:
    """Everything transitions ≥ `from_turn` wrote, gone, and what their compactions archived live again (a replay
    runs those compactions again); what it retired, to shred (the replay writes its transitions as new rows under
    fresh leaves, so nothing of the old suffix stays readable in any copy once the shred ran)."""
    await artifacts_repo.unarchive_from(tx, session_id, from_turn)
    retired = await artifacts_repo.delete_from_turn(tx, session_id, from_turn)
    await sessions_repo.delete_checkpoints_from(tx, session_id, from_turn)
    return retired.add(await tools_repo.delete_environments_from(tx, session_id, from_turn))  # sealed, own leaves
