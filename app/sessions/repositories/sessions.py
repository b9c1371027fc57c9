"""SQL for sessions and their checkpoints. Every lookup is scoped to the tenant: a foreign id reads as unknown.

A session's system prompt and tools are stored sealed (settings_sealing.py): `create` seals them, every read that
returns sessions opens them, and `delete_session` returns the leaves of everything the deletion erased, to shred.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, delete, func, literal, or_, select, true, tuple_, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import set_committed_value

from app.db.models import AgentSession, Artifact, Checkpoint, EnvSnapshot
from app.db.openai_models import OpenAIConversation, OpenAIResponse
from app.ids import new_id
from app.keys.content import Sealer
from app.pagination import Position
from app.sessions.repositories.artifacts import Retired
from app.sessions.repositories.leases import live_status
from app.sessions.repositories.settings_sealing import open_sessions, seal_settings


async def create(db: AsyncSession, sealer: Sealer, **values: Any) -> AgentSession:
    """The session row, its system prompt and tools sealed under a leaf of its own (the object returned holds them
    opened)."""
    system_prompt, tools = values.get("system_prompt"), list(values.get("tools") or [])
    sealed = await seal_settings(sealer, values["tenant_id"], values["id"], system_prompt, tools)
    row = AgentSession(**{**values, **sealed})
    db.add(row)
    await db.flush()
    set_committed_value(row, "system_prompt", system_prompt)
    set_committed_value(row, "tools", tools)
    return row


async def get(db: AsyncSession, sealer: Sealer, tenant_id: str, session_id: str) -> AgentSession | None:
    stmt = select(AgentSession).where(AgentSession.id == session_id, AgentSession.tenant_id == tenant_id)
    row = (await db.execute(stmt)).scalar_one_or_none()
    if row is not None:
        await open_sessions(sealer, [row])
    return row


async def record_transition(db: AsyncSession, session_id: str, *, turns: int, token_count: int) -> None:
    await db.execute(
        update(AgentSession)
        .where(AgentSession.id == session_id)
        .values(turns=turns, token_count=token_count, updated_at=func.now())
    )


async def set_sampling(db: AsyncSession, session_id: str, sampling: dict[str, Any]) -> None:
    await db.execute(update(AgentSession).where(AgentSession.id == session_id).values(sampling=sampling))


async def delete_session(db: AsyncSession, tenant_id: str, session_id: str) -> Retired | None:
    """Delete the row; artifacts (archived ones too), provenance edges, checkpoints, tool environments and the OpenAI
    conversation and responses go with it (ON DELETE CASCADE). Returns what it erased, to shred once it committed:
    every leaf the session's content was sealed under, read in this transaction before the cascade (nothing can add a
    row meanwhile: the caller holds the session's lease and its row lock), and how many of those rows were plaintext
    from before the sealing migrations. None: no such session."""
    owned = select(AgentSession.id).where(AgentSession.id == session_id, AgentSession.tenant_id == tenant_id)
    if (await db.execute(owned.with_for_update())).scalar_one_or_none() is None:
        return None
    retired = Retired()
    conversation = select(OpenAIConversation.id).where(OpenAIConversation.session_id == session_id)
    holders = (
        (AgentSession.leaf, AgentSession.id == session_id), (Artifact.leaf, Artifact.session_id == session_id),
        (EnvSnapshot.leaf, EnvSnapshot.session_id == session_id),
        (OpenAIConversation.leaf, OpenAIConversation.session_id == session_id),
        # The conversation's cascade also takes its responses placed in other sessions (branches).
        (OpenAIResponse.leaf, or_(OpenAIResponse.session_id == session_id,
                                  OpenAIResponse.conversation_id.in_(conversation))),
    )
    for leaf, owned_here in holders:
        leaves = (await db.execute(select(leaf).where(owned_here))).scalars().all()
        retired = retired.add(Retired([x for x in leaves if x is not None], sum(x is None for x in leaves)))
    await db.execute(delete(AgentSession).where(AgentSession.id == session_id))
    return retired


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
    db: AsyncSession, sealer: Sealer, session: AgentSession, *, epoch: int, turns: int, token_count: int,
    system_prompt: str | None,
) -> Retired:
    """The swap's last write: the new epoch tells clients (and other processes' caches) the state was rewritten.
    A system prompt the forget changed is sealed again under a fresh leaf, and the old leaf is returned, to shred
    with the forget's other leaves (the old ciphertext stays in dead tuples, WAL and backups)."""
    values: dict[str, Any] = {"epoch": epoch, "turns": turns, "token_count": token_count, "updated_at": func.now()}
    if system_prompt == session.system_prompt:
        await db.execute(update(AgentSession).where(AgentSession.id == session.id).values(**values))
        return Retired()
    retired = Retired([session.leaf] if session.leaf is not None else [], int(session.leaf is None))
    tools = list(session.tools or [])
    sealed = await seal_settings(sealer, session.tenant_id, session.id, system_prompt, tools)
    await db.execute(update(AgentSession).where(AgentSession.id == session.id).values(**values, **sealed))
    # The object as stored now, its settings opened (never flushed back).
    for name, value in {**sealed, "system_prompt": system_prompt, "tools": tools}.items():
        set_committed_value(session, name, value)
    return retired


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
    sealer: Sealer,
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
    rows = list((await db.execute(stmt)).scalars())
    await open_sessions(sealer, rows)
    return rows
