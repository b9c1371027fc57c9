"""SQL for the built-in tool environment's snapshots and the ledger of fired consequential calls.

A snapshot's state is sealed under a leaf of its own (settings_sealing.py); deleting snapshots returns their leaves,
to shred with the forget that deleted them."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AgentSession, Checkpoint, EnvSnapshot, ToolExecution
from app.ids import new_id
from app.keys.content import Sealer
from app.sessions.repositories.artifacts import Retired
from app.sessions.repositories.settings_sealing import open_state, seal_state
from app.tool_calls import INITIAL_STATE, ToolCall


async def environment(
    db: AsyncSession, sealer: Sealer, session_id: str, *, before_turn: int | None = None
) -> tuple[str | None, dict[str, Any]]:
    """(snapshot id, state) of the latest snapshot (before `before_turn` when given); the initial state if none."""
    stmt = select(EnvSnapshot).where(EnvSnapshot.session_id == session_id)
    if before_turn is not None:
        stmt = stmt.where(EnvSnapshot.turn < before_turn)
    row = (await db.execute(stmt.order_by(EnvSnapshot.turn.desc()).limit(1))).scalar_one_or_none()
    if row is None:
        return None, copy.deepcopy(INITIAL_STATE)
    state = await open_state(sealer, row.tenant_id, row.id, row.state, row.state_sealed)
    # A shredded snapshot (a backup restored from before a forget deleted it) restores the initial environment.
    return row.id, copy.deepcopy(INITIAL_STATE) if state is None else state


async def save_environment(db: AsyncSession, sealer: Sealer, session_id: str, turn: int, state: dict[str, Any]) -> str:
    """The snapshot, sealed under a fresh leaf. A snapshot already at `turn` is replaced (a new id, a new leaf: the
    binding names the id); transitions rewrite a turn only after `delete_environments_from`, which retires it."""
    snapshot_id = new_id("env")
    tenant_id = (await db.execute(select(AgentSession.tenant_id).where(AgentSession.id == session_id))).scalar_one()
    sealed = await seal_state(sealer, tenant_id, session_id, snapshot_id, state)
    await db.execute(
        insert(EnvSnapshot)
        .values(id=snapshot_id, session_id=session_id, turn=turn, **sealed)
        .on_conflict_do_update(index_elements=["session_id", "turn"], set_={**sealed, "id": snapshot_id})
    )
    return snapshot_id


async def delete_environments_from(db: AsyncSession, session_id: str, turn: int) -> Retired:
    """Delete the snapshots of transitions ≥ `turn`; their leaves, to shred once the caller committed."""
    stmt = delete(EnvSnapshot).where(EnvSnapshot.session_id == session_id, EnvSnapshot.turn >= turn)
    leaves = (await db.execute(stmt.returning(EnvSnapshot.leaf))).scalars().all()
    return Retired([leaf for leaf in leaves if leaf is not None], sum(leaf is None for leaf in leaves))


async def fired(db: AsyncSession, session_id: str) -> set[str]:
    stmt = select(ToolExecution.call_id).where(ToolExecution.session_id == session_id)
    return set((await db.execute(stmt)).scalars())


async def record_fired(db: AsyncSession, session_id: str, calls: Sequence[ToolCall]) -> None:
    if calls:
        rows = [
            {"session_id": session_id, "call_id": c.id, "name": c.name, "arguments_sha256": c.arguments_sha256}
            for c in calls
        ]
        await db.execute(insert(ToolExecution).values(rows).on_conflict_do_nothing())


async def link_checkpoints(db: AsyncSession, session_id: str, from_turn: int) -> None:
    """Name, on each checkpoint from `from_turn` on, the environment snapshot in force at its boundary (the latest
    snapshot at or before its transition): what a replay restoring that checkpoint restores the tools to."""
    latest = (
        select(EnvSnapshot.id)
        .where(EnvSnapshot.session_id == Checkpoint.session_id, EnvSnapshot.turn <= Checkpoint.turn)
        .order_by(EnvSnapshot.turn.desc())
        .limit(1)
        .scalar_subquery()
    )
    await db.execute(
        update(Checkpoint)
        .where(Checkpoint.session_id == session_id, Checkpoint.turn >= from_turn)
        .values(env_snapshot_id=latest)
    )
