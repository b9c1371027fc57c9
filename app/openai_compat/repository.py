"""SQL of the OpenAI-compatible tables. Every lookup is scoped to the tenant.

The client's strings here are sealed at rest (docs/erasure-at-rest.md): a conversation's metadata and a response's
parameters (its tools, metadata, a plan's reply), each under a leaf of its own drawn from its session's stream, bound
to (tenant, table, row id, column). Rows are opened as they are read (as committed values: a flush never writes them
back); rows from before migration 0021 hold plaintext and read as before. Deleting the session shreds their leaves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import set_committed_value

from app.db.legacy import LegacyJson
from app.db.models import Artifact
from app.db.openai_models import OpenAIChatHead, OpenAIConversation, OpenAIResponse
from app.db.statements import Row
from app.keys.content import Sealer
from app.keys.envelope import Binding
from app.keys.errors import Erased
from app.keys.sealed import SealedColumn
from app.sessions.repositories.sealing import open_artifacts

# Sealed rows: table → (the clear attribute, its sealed column). The leaf is the row's `leaf`.
_SEALED: dict[type[Any], tuple[str, str]] = {
    OpenAIConversation: ("meta", "meta_sealed"), OpenAIResponse: ("params", "params_sealed"),
}


def _binding(row: Any, column: str) -> Binding:
    return Binding(row.tenant_id, row.__tablename__, row.id, column)


# What `lethe keys verify` checks (app/keys/sealed.py).
def _verified(table: str, clear: str, sealed: str) -> SealedColumn:
    def binding(row: Row, _column: str) -> Binding:
        return Binding(row["tenant_id"], table, row["id"], clear)

    return SealedColumn(table, ("id",), (sealed,), binding)


SEALED_COLUMNS = tuple(_verified(model.__tablename__, clear, sealed) for model, (clear, sealed) in _SEALED.items())


def _legacy(table: str, clear: str, sealed: str) -> LegacyJson:
    return LegacyJson(table, (clear,), sealed, document=lambda row: dict(row[clear] or {}),
                      binding=lambda tenant_id, row: Binding(tenant_id, table, row["id"], clear),
                      stream=lambda row: row["session_id"])


# Rows from before migration 0021, for `lethe keys seal` (app/db/legacy.py).
LEGACY = tuple(_legacy(model.__tablename__, clear, sealed) for model, (clear, sealed) in _SEALED.items())


async def _seal(sealer: Sealer, row: Any, value: dict[str, Any], *, leaf: int | None = None) -> dict[str, Any]:
    """The row's sealed columns for `value`: under `leaf`, or a fresh one of its session's stream."""
    clear, sealed = _SEALED[type(row)]
    if leaf is None:
        leaf = await sealer.leaf(row.tenant_id, row.session_id)
    return {"leaf": leaf, sealed: await sealer.seal_json(leaf, _binding(row, clear), value), clear: None}


async def _open(sealer: Sealer, row: Any) -> Any:
    """`row` with its client strings opened in place; a shredded leaf opens as empty (nothing of it is shown)."""
    clear, sealed = _SEALED[type(row)]
    ciphertext = getattr(row, sealed)
    if ciphertext is not None:
        try:
            value = await sealer.open_json(_binding(row, clear), ciphertext)
        except Erased:
            value = {}
        set_committed_value(row, clear, value)
    elif getattr(row, clear) is None:
        set_committed_value(row, clear, {})
    return row


async def add(db: AsyncSession, sealer: Sealer, row: Any) -> None:
    """Insert `row`; a conversation's metadata or a response's parameters are stored sealed (the object keeps them
    opened)."""
    if type(row) not in _SEALED:
        db.add(row)
        await db.flush()
        return
    clear, _ = _SEALED[type(row)]
    value = dict(getattr(row, clear) or {})
    for name, stored in (await _seal(sealer, row, value)).items():
        setattr(row, name, stored)
    db.add(row)
    await db.flush()
    set_committed_value(row, clear, value)


async def conversation(
    db: AsyncSession, sealer: Sealer, tenant_id: str, conversation_id: str, *, for_update: bool = False
) -> OpenAIConversation | None:
    stmt = select(OpenAIConversation).where(
        OpenAIConversation.id == conversation_id, OpenAIConversation.tenant_id == tenant_id
    )
    if for_update:
        stmt = stmt.with_for_update()
    row = (await db.execute(stmt)).scalar_one_or_none()
    return None if row is None else await _open(sealer, row)


async def conversation_of_session(db: AsyncSession, session_id: str) -> str | None:
    """The conversation a session serves, if any (a session serves at most one: the column is unique)."""
    stmt = select(OpenAIConversation.id).where(OpenAIConversation.session_id == session_id)
    return (await db.execute(stmt)).scalar_one_or_none()


async def set_metadata(db: AsyncSession, sealer: Sealer, conv: OpenAIConversation, meta: dict[str, str]) -> None:
    """New metadata, sealed under the conversation's leaf (a row from before migration 0021 takes a fresh one): an
    update is not a forget, and the leaf goes with the conversation's session when it is deleted."""
    sealed = await _seal(sealer, conv, dict(meta), leaf=conv.leaf)
    await db.execute(update(OpenAIConversation).where(OpenAIConversation.id == conv.id).values(**sealed))


async def set_session(db: AsyncSession, conversation_id: str, session_id: str) -> None:
    await db.execute(
        update(OpenAIConversation).where(OpenAIConversation.id == conversation_id).values(session_id=session_id)
    )


async def response(db: AsyncSession, sealer: Sealer, tenant_id: str, response_id: str) -> OpenAIResponse | None:
    stmt = select(OpenAIResponse).where(OpenAIResponse.id == response_id, OpenAIResponse.tenant_id == tenant_id)
    row = (await db.execute(stmt)).scalar_one_or_none()
    return None if row is None else await _open(sealer, row)


async def at_turn(db: AsyncSession, sealer: Sealer, session_id: str, turn: int) -> list[Artifact]:
    """A transition's artifacts (archived ones too: a compaction later does not change what a response was)."""
    stmt = select(Artifact).where(Artifact.session_id == session_id, Artifact.turn == turn).order_by(Artifact.position)
    return await open_artifacts(sealer, list((await db.execute(stmt)).scalars()))


async def artifacts(db: AsyncSession, sealer: Sealer, session_id: str, ids: Sequence[str]) -> list[Artifact]:
    if not ids:
        return []
    stmt = select(Artifact).where(Artifact.session_id == session_id, Artifact.id.in_(list(ids)))
    return await open_artifacts(sealer, list((await db.execute(stmt.order_by(Artifact.position))).scalars()))


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
