"""SQL of branching a session (app/sessions/branching.py): read the rows of a session's first transitions as plain
dicts, and write a new session made of such rows. The caller remaps ids; nothing here interprets a row.

Artifacts are read opened and written sealed afresh: a branch's artifact is a new erasure unit (its own id, its own
leaf in the branch's stream), so forgetting it in one session never reaches the other's copy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AgentSession, Artifact, Checkpoint, EnvSnapshot, ProvenanceEdge, ToolExecution
from app.sessions.repositories.sealing import open_artifacts, seal_rows, sealer_of

Row = dict[str, Any]


@dataclass(frozen=True)
class Transitions:
    """Every row of a session that transitions ≤ `turn` wrote (artifacts archived later included)."""

    artifacts: list[Row]
    edges: list[Row]
    checkpoints: list[Row]
    environments: list[Row]
    fired: list[Row]


def _columns(model: Any, rows: Sequence[Any]) -> list[Row]:
    names = [c.key for c in model.__table__.columns]
    return [{name: getattr(row, name) for name in names} for row in rows]


async def transitions_through(db: AsyncSession, session_id: str, turn: int) -> Transitions:
    async def rows(model: Any, *where: Any, order: Any = None) -> list[Row]:
        stmt = select(model).where(*where)
        if order is not None:
            stmt = stmt.order_by(order)
        found = list((await db.execute(stmt)).scalars())
        return _columns(model, await open_artifacts(db, found) if model is Artifact else found)

    return Transitions(
        artifacts=await rows(Artifact, Artifact.session_id == session_id, Artifact.turn <= turn,
                             order=Artifact.position),
        edges=await rows(ProvenanceEdge, ProvenanceEdge.session_id == session_id, ProvenanceEdge.turn <= turn),
        checkpoints=await rows(Checkpoint, Checkpoint.session_id == session_id, Checkpoint.turn <= turn,
                               order=Checkpoint.turn),
        environments=await rows(EnvSnapshot, EnvSnapshot.session_id == session_id, EnvSnapshot.turn <= turn),
        fired=await rows(ToolExecution, ToolExecution.session_id == session_id),
    )


async def insert_session(db: AsyncSession, session: Row, copied: Transitions) -> None:
    """The branch in one go: its session row, then the rows that reference it."""
    await db.execute(insert(AgentSession), [session])
    for model, rows in ((Artifact, await seal_rows(sealer_of(db), copied.artifacts)), (ProvenanceEdge, copied.edges),
                        (EnvSnapshot, copied.environments), (Checkpoint, copied.checkpoints),
                        (ToolExecution, copied.fired)):
        if rows:
            await db.execute(insert(model), rows)
