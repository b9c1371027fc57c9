"""SQL of the OpenAI-compatible tables. Every lookup is scoped to the tenant."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Artifact
from app.db.openai_models import OpenAIChatHead, OpenAIConversation, OpenAIResponse
from app.sessions.repositories.sealing import open_artifacts


async def add(db: AsyncSession, row: Any) -> None:
    db.add(row)
    await db.flush()


async def conversation(db: AsyncSession, tenant_id: str, conversation_id: str, *, for_update: bool = False
                       ) -> OpenAIConversation | None:
    stmt = select(OpenAIConversation).where(
        OpenAIConversation.id == conversation_id, OpenAIConversation.tenant_id == tenant_id
    )
    if for_update:
        stmt = stmt.with_for_update()
    return (await db.execute(stmt)).scalar_one_or_none()


async def conversation_of_session(db: AsyncSession, session_id: str) -> str | None:
    """The conversation a session serves, if any (a session serves at most one: the column is unique)."""
    stmt = select(OpenAIConversation.id).where(OpenAIConversation.session_id == session_id)
    return (await db.execute(stmt)).scalar_one_or_none()


async def set_metadata(db: AsyncSession, conversation_id: str, meta: dict[str, str]) -> None:
    await db.execute(update(OpenAIConversation).where(OpenAIConversation.id == conversation_id).values(meta=meta))


async def set_session(db: AsyncSession, conversation_id: str, session_id: str) -> None:
    await db.execute(
        update(OpenAIConversation).where(OpenAIConversation.id == conversation_id).values(session_id=session_id)
    )


async def response(db: AsyncSession, tenant_id: str, response_id: str) -> OpenAIResponse | None:
    stmt = select(OpenAIResponse).where(OpenAIResponse.id == response_id, OpenAIResponse.tenant_id == tenant_id)
    return (await db.execute(stmt)).scalar_one_or_none()


async def at_turn(db: AsyncSession, session_id: str, turn: int) -> list[Artifact]:
    """A transition's artifacts (archived ones too: a compaction later does not change what a response was)."""
    stmt = select(Artifact).where(Artifact.session_id == session_id, Artifact.turn == turn).order_by(Artifact.position)
    return await open_artifacts(db, list((await db.execute(stmt)).scalars()))


async def artifacts(db: AsyncSession, session_id: str, ids: Sequence[str]) -> list[Artifact]:
    if not ids:
        return []
    stmt = select(Artifact).where(Artifact.session_id == session_id, Artifact.id.in_(list(ids)))
    return await open_artifacts(db, list((await db.execute(stmt.order_by(Artifact.position))).scalars()))


async def head(db: AsyncSession, tenant_id: str, digest: str) -> OpenAIChatHead | None:
    stmt = select(OpenAIChatHead).where(OpenAIChatHead.tenant_id == tenant_id, OpenAIChatHead.digest == digest)
    return (await db.execute(stmt)).scalar_one_or_none()


async def put_head(db: AsyncSession, **values: Any) -> None:
    """One head per session (its newest message list), and one session per digest (the newest holding it)."""
    await db.execute(delete(OpenAIChatHead).where(or_(
        OpenAIChatHead.session_id == values["session_id"],
        (OpenAIChatHead.tenant_id == values["tenant_id"]) & (OpenAIChatHead.digest == values["digest"]),
    )))
    db.add(OpenAIChatHead(**values))
    await db.flush()
