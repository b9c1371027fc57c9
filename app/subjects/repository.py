"""Subjects' SQL: the subject rows, and the reads an access request walks (a subject's sessions, their artifacts,
the memory of their namespaces), each a keyset page so an export of any size holds one page at a time."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, func, literal_column, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.memory_models import MemoryRecord
from app.db.models import AgentSession, Artifact
from app.db.openai_models import OpenAIConversation
from app.db.subject_models import Subject
from app.keys.content import Sealer
from app.memory.repositories.records import LIVE
from app.memory.repositories.sealing import RECORDS, open_value
from app.sessions.repositories.sealing import open_artifacts


async def ensure(db: AsyncSession, tenant_id: str, subject_id: str) -> None:
    """The subject exists (a session or a conversation naming it makes it; nothing else changes)."""
    await db.execute(insert(Subject).values(tenant_id=tenant_id, id=subject_id).on_conflict_do_nothing())


async def put_namespaces(db: AsyncSession, tenant_id: str, subject_id: str, namespaces: list[str]) -> bool:
    """Link exactly `namespaces` to the subject, making it if needed; whether it was made now."""
    stmt = (
        insert(Subject).values(tenant_id=tenant_id, id=subject_id, memory_namespaces=namespaces)
        .on_conflict_do_update(
            index_elements=[Subject.tenant_id, Subject.id],
            set_={"memory_namespaces": namespaces, "updated_at": func.now()},
        )
        .returning(literal_column("xmax = 0", Boolean))  # PostgreSQL: true on the row's insert, false on update
    )
    return bool((await db.execute(stmt)).scalar_one())


async def get(db: AsyncSession, tenant_id: str, subject_id: str) -> Subject | None:
    stmt = select(Subject).where(Subject.tenant_id == tenant_id, Subject.id == subject_id)
    return (await db.execute(stmt)).scalar_one_or_none()


@dataclass(frozen=True)
class LinkedSession:
    id: str
    created_at: datetime
    turns: int
    conversation_id: str | None  # the OpenAI conversation the session is, if any


async def session_count(db: AsyncSession, tenant_id: str, subject_id: str) -> int:
    stmt = select(func.count()).where(AgentSession.tenant_id == tenant_id, AgentSession.subject_id == subject_id)
    return int((await db.execute(stmt)).scalar_one())


async def sessions_after(
    db: AsyncSession, tenant_id: str, subject_id: str, after: str, limit: int
) -> list[LinkedSession]:
    """The subject's sessions with ids after `after`, in id order (creation order: ids are time-ordered)."""
    stmt = (
        select(AgentSession.id, AgentSession.created_at, AgentSession.turns, OpenAIConversation.id)
        .outerjoin(OpenAIConversation, OpenAIConversation.session_id == AgentSession.id)
        .where(AgentSession.tenant_id == tenant_id, AgentSession.subject_id == subject_id, AgentSession.id > after)
        .order_by(AgentSession.id)
        .limit(limit)
    )
    return [LinkedSession(*row) for row in (await db.execute(stmt)).all()]


async def artifacts_after(
    db: AsyncSession, sealer: Sealer, tenant_id: str, session_id: str, after: int, limit: int
) -> list[Artifact]:
    """A page of the session's live artifacts after log position `after`, opened (erased ones flagged)."""
    stmt = (
        select(Artifact)
        .where(Artifact.tenant_id == tenant_id, Artifact.session_id == session_id, Artifact.archived_by.is_(None),
               Artifact.position > after)
        .order_by(Artifact.position)
        .limit(limit)
    )
    return await open_artifacts(sealer, list((await db.execute(stmt)).scalars()))


@dataclass(frozen=True)
class HeldValue:
    key: str
    version: int
    value: Any
    updated_at: datetime


async def memory_after(
    db: AsyncSession, sealer: Sealer, tenant_id: str, namespace: str, after: str, limit: int
) -> tuple[list[HeldValue], str | None]:
    """A page of the namespace's live values after key `after` (a value whose leaf was shredded is left out: it is
    not held any more), and the cursor for the next page (None at the end)."""
    stmt = (
        select(MemoryRecord.key, MemoryRecord.version, MemoryRecord.value, MemoryRecord.value_sealed,
               MemoryRecord.updated_at)
        .where(MemoryRecord.tenant_id == tenant_id, MemoryRecord.namespace == namespace, MemoryRecord.key > after,
               text(LIVE))
        .order_by(MemoryRecord.key)
        .limit(limit)
    )
    rows = (await db.execute(stmt)).mappings().all()
    held = []
    for row in rows:
        opened = await open_value(sealer, tenant_id, RECORDS, namespace, row["key"], row)
        if not opened.erased:
            held.append(HeldValue(row["key"], row["version"], opened.value, row["updated_at"]))
    return held, (rows[-1]["key"] if len(rows) == limit else None)


async def live_keys_after(db: AsyncSession, tenant_id: str, namespace: str, after: str, limit: int) -> list[str]:
    """A page of the namespace's keys that are not tombstones, after `after`, in key order."""
    stmt = (
        select(MemoryRecord.key)
        .where(MemoryRecord.tenant_id == tenant_id, MemoryRecord.namespace == namespace, MemoryRecord.key > after,
               MemoryRecord.forgotten.is_(False))
        .order_by(MemoryRecord.key)
        .limit(limit)
    )
    return list((await db.execute(stmt)).scalars())


async def mark_erased(db: AsyncSession, tenant_id: str, subject_id: str, forget_id: str) -> None:
    """The subject keeps only its id, when it was erased and by which job."""
    await db.execute(
        update(Subject).where(Subject.tenant_id == tenant_id, Subject.id == subject_id)
        .values(erased_at=func.now(), erase_forget_id=forget_id, updated_at=func.now())
    )


async def others_after(db: AsyncSession, tenant_id: str, subject_id: str, after: str, limit: int) -> list[str]:
    """A page of the tenant's sessions that are not this subject's (anyone else's, or no one's), in id order."""
    stmt = (
        select(AgentSession.id)
        .where(AgentSession.tenant_id == tenant_id, AgentSession.subject_id.is_distinct_from(subject_id),
               AgentSession.id > after)
        .order_by(AgentSession.id)
        .limit(limit)
    )
    return list((await db.execute(stmt)).scalars())
