"""SQL for sessions and their checkpoints. Every lookup is scoped to the tenant: a foreign id reads as unknown."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, delete, func, literal, select, true, tuple_, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AgentSession, Checkpoint
from app.ids import new_id
from app.pagination import Position
from app.sessions.repositories.leases import live_status


async def create(db: AsyncSession, **values: Any) -> AgentSession:
    row = AgentSession(**values)
    db.add(row)
    await db.flush()
    return row


async def get(db: AsyncSession, tenant_id: str, session_id: str) -> AgentSession | None:
    stmt = select(AgentSession).where(AgentSession.id == session_id, AgentSession.tenant_id == tenant_id)
    return (await db.execute(stmt)).scalar_one_or_none()


async def record_transition(db: AsyncSession, session_id: str, *, turns: int, token_count: int) -> None:
    await db.execute(
        update(AgentSession)
        .where(AgentSession.id == session_id)
        .values(turns=turns, token_count=token_count, updated_at=func.now())
    )


async def set_sampling(db: AsyncSession, session_id: str, sampling: dict[str, Any]) -> None:
    await db.execute(update(AgentSession).where(AgentSession.id == session_id).values(sampling=sampling))


async def delete_session(db: AsyncSession, tenant_id: str, session_id: str) -> bool:
    """Delete the row; artifacts, provenance edges and checkpoints go with it (ON DELETE CASCADE)."""
    stmt = (
        delete(AgentSession)
        .where(AgentSession.id == session_id, AgentSession.tenant_id == tenant_id)
        .returning(AgentSession.id)
    )
    return (await db.execute(stmt)).scalar_one_or_none() is not None


async def add_checkpoints(db: AsyncSession, session_id: str, rows: Sequence[tuple[int, int, str]]) -> None:
    """(turn, token_offset, manifest_sha256) rows; a boundary already recorded keeps its first checkpoint."""
    if not rows:
        return
    values = [
        {"id": new_id("ckp"), "session_id": session_id, "turn": turn, "token_offset": offset, "manifest_sha256": sha}
        for turn, offset, sha in rows
    ]
    await db.execute(insert(Checkpoint).values(values).on_conflict_do_nothing(index_elements=["session_id", "turn"]))


async def checkpoints(db: AsyncSession, tenant_id: str, session_id: str) -> list[Checkpoint]:
    stmt = (
        select(Checkpoint)
        .join(AgentSession, AgentSession.id == Checkpoint.session_id)
        .where(Checkpoint.session_id == session_id, AgentSession.tenant_id == tenant_id)
        .order_by(Checkpoint.turn)
    )
    return list((await db.execute(stmt)).scalars())


async def delete_checkpoints_from(db: AsyncSession, session_id: str, turn: int) -> None:
    await db.execute(delete(Checkpoint).where(Checkpoint.session_id == session_id, Checkpoint.turn >= turn))


async def record_forget(
    db: AsyncSession, session_id: str, *, epoch: int, turns: int, token_count: int, system_prompt: str | None
) -> None:
    """The swap's last write: the new epoch tells clients (and other processes' caches) the state was rewritten."""
    await db.execute(
        update(AgentSession)
        .where(AgentSession.id == session_id)
        .values(epoch=epoch, turns=turns, token_count=token_count, system_prompt=system_prompt, updated_at=func.now())
    )


async def bump_cache_generation(db: AsyncSession, session_id: str) -> None:
    """A new cache salt for the session (app/runtime/salts.py): its next requests reach none of its cached blocks."""
    await db.execute(
        update(AgentSession)
        .where(AgentSession.id == session_id)
        .values(cache_generation=AgentSession.cache_generation + 1)
    )


async def tenant_of(db: AsyncSession, session_id: str) -> str | None:
    """The tenant owning a session, whichever it is (the caller is not scoped to one: telling a session deleted
    meanwhile from another tenant's)."""
    stmt = select(AgentSession.tenant_id).where(AgentSession.id == session_id)
    return (await db.execute(stmt)).scalar_one_or_none()


async def flag_sources(db: AsyncSession, session_id: str, sources: Sequence[str]) -> None:
    """Add sources to the session's sink policy (their derivations may not reach a consequential tool call)."""
    await db.execute(
        update(AgentSession)
        .where(AgentSession.id == session_id)
        .values(flagged_sources=func.array_cat(AgentSession.flagged_sources, list(sources)))
    )


def _older_than(after: Position | None) -> ColumnElement[bool]:
    if after is None:
        return true()
    return tuple_(AgentSession.created_at, AgentSession.id) < tuple_(literal(after.created_at), literal(after.id))


async def page(
    db: AsyncSession,
    tenant_id: str,
    *,
    after: Position | None,
    limit: int,
    status: str | None = None,
    context_policy: str | None = None,
) -> list[AgentSession]:
    """Up to `limit` sessions, newest first, older than `after`; `status` filters on the live status (a lease that
    expired reads `idle`), as `get` reports it."""
    stmt = select(AgentSession).where(AgentSession.tenant_id == tenant_id, _older_than(after))
    if context_policy is not None:
        stmt = stmt.where(AgentSession.context_policy == context_policy)
    if status is not None:
        stmt = stmt.where(live_status() == status)
    stmt = stmt.order_by(AgentSession.created_at.desc(), AgentSession.id.desc()).limit(limit)
    return list((await db.execute(stmt)).scalars())
