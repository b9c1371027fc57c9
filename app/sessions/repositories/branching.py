"""SQL of branching a session (app/sessions/branching.py): read the rows of a session's first transitions as plain
dicts, and write a new session made of such rows. The caller remaps ids; nothing here interprets a row.

Artifacts, tool environment snapshots and the session's settings (system prompt, tools) are read opened and written
sealed afresh: a branch's copy is a new erasure unit (its own id, its own leaf in the branch's stream), so forgetting
it in one session, or deleting that session, never reaches the other's copy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AgentSession, Artifact, Checkpoint, EnvSnapshot, ProvenanceEdge, ToolExecution
from app.keys.content import Sealer
from app.sessions.repositories.sealing import open_artifacts, seal_rows
from app.sessions.repositories.settings_sealing import open_state, seal_environment_rows, seal_settings

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


async def transitions_through(db: AsyncSession, sealer: Sealer, session_id: str, turn: int) -> Transitions:
    async def rows(model: Any, *where: Any, order: Any = None) -> list[Row]:
        stmt = select(model).where(*where)
        if order is not None:
            stmt = stmt.order_by(order)
        found = list((await db.execute(stmt)).scalars())
        return _columns(model, await open_artifacts(sealer, found) if model is Artifact else found)

    async def environments() -> list[Row]:
        found = await rows(EnvSnapshot, EnvSnapshot.session_id == session_id, EnvSnapshot.turn <= turn)
        for row in found:  # opened: the branch seals its copies under its own leaves
            state = await open_state(sealer, row["tenant_id"], row["id"], row["state"], row["state_sealed"])
            row.update(state=state, state_sealed=None, leaf=None)
        return [row for row in found if row["state"] is not None]  # a shredded snapshot is not copied

    return Transitions(
        artifacts=await rows(Artifact, Artifact.session_id == session_id, Artifact.turn <= turn,
                             order=Artifact.position),
        edges=await rows(ProvenanceEdge, ProvenanceEdge.session_id == session_id, ProvenanceEdge.turn <= turn),
        checkpoints=await rows(Checkpoint, Checkpoint.session_id == session_id, Checkpoint.turn <= turn,
                               order=Checkpoint.turn),
        environments=await environments(),
        fired=await rows(ToolExecution, ToolExecution.session_id == session_id),
    )


async def insert_session(db: AsyncSession, sealer: Sealer, session: Row, copied: Transitions) -> None:
    """The branch in one go: its session row, then the rows that reference it."""
    tenant_id = session["tenant_id"]
    settings = await seal_settings(sealer, tenant_id, session["id"], session.get("system_prompt"), session.get("tools"))
    await db.execute(insert(AgentSession), [{**session, **settings}])
    environments = await seal_environment_rows(sealer, tenant_id, copied.environments)
    for model, rows in ((Artifact, await seal_rows(sealer, copied.artifacts)), (ProvenanceEdge, copied.edges),
                        (EnvSnapshot, environments), (Checkpoint, copied.checkpoints),
                        (ToolExecution, copied.fired)):
        if rows:
            await db.execute(insert(model), rows)
