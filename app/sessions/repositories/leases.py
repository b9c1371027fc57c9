"""SQL for session leases: who holds a session, until when (the database's clock), and what for.

A lease is taken, renewed and released in short transactions of its own; the writes of the work done under it
commit in a transaction that first locks the row and checks the lease is still the taker's (`lock_held`), so a
holder that lost its lease (it stalled past the expiry and another process took the session over) writes nothing.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ColumnElement, and_, case, func, literal, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AgentSession
from app.keys.content import Sealer
from app.sessions.repositories.settings_sealing import open_sessions


def _live() -> ColumnElement[bool]:
    return and_(AgentSession.lease_owner.is_not(None), AgentSession.lease_expires_at > func.now())


def live_status() -> ColumnElement[str]:
    """The session's status as clients see it: what holds its lease, or `idle` when no live lease does (a
    released one, or one whose holder died and let it expire)."""
    return case((_live(), AgentSession.status), else_=literal("idle"))


def _expiry(ttl_s: float) -> ColumnElement[datetime]:
    return func.now() + func.make_interval(0, 0, 0, 0, 0, 0, ttl_s)


async def take(
    db: AsyncSession, sealer: Sealer, tenant_id: str, session_id: str, owner: str, ttl_s: float, status: str
) -> AgentSession | None:
    """The session, leased to `owner` for `ttl_s`; None when another live lease holds it (or no such session)."""
    stmt = (
        update(AgentSession)
        .where(AgentSession.id == session_id, AgentSession.tenant_id == tenant_id, ~_live())
        .values(lease_owner=owner, lease_expires_at=_expiry(ttl_s), status=status)
        .returning(AgentSession.id)
    )
    if (await db.execute(stmt)).scalar_one_or_none() is None:
        return None
    row = select(AgentSession).where(AgentSession.id == session_id).execution_options(populate_existing=True)
    found = (await db.execute(row)).scalar_one()
    await open_sessions(sealer, [found])  # populate_existing loaded its settings' columns as stored: sealed
    return found


async def renew(db: AsyncSession, session_id: str, owner: str, ttl_s: float) -> bool:
    """Push the expiry on; False when the lease is no longer `owner`'s."""
    stmt = (
        update(AgentSession)
        .where(AgentSession.id == session_id, AgentSession.lease_owner == owner)
        .values(lease_expires_at=_expiry(ttl_s))
        .returning(AgentSession.id)
    )
    return (await db.execute(stmt)).scalar_one_or_none() is not None


async def release(db: AsyncSession, session_id: str, owner: str) -> None:
    """Let the session go (nothing, when the lease is no longer `owner`'s)."""
    await db.execute(
        update(AgentSession)
        .where(AgentSession.id == session_id, AgentSession.lease_owner == owner)
        .values(lease_owner=None, lease_expires_at=None, status="idle")
    )


async def lock_held(db: AsyncSession, sealer: Sealer, session_id: str, owner: str) -> AgentSession | None:
    """The session row locked for the rest of the transaction, if `owner` still holds its lease (None otherwise).

    Only the owner's name is checked, not the expiry: a lease past its expiry that nobody took over is still the
    owner's, and one that was taken over names someone else. The row lock makes the check hold until the commit."""
    stmt = (
        select(AgentSession)
        .where(AgentSession.id == session_id, AgentSession.lease_owner == owner)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    row = (await db.execute(stmt)).scalar_one_or_none()
    if row is not None:
        await open_sessions(sealer, [row])
    return row


async def statuses(db: AsyncSession, session_ids: list[str]) -> dict[str, str]:
    """The live status of each of `session_ids` (one query for a page)."""
    if not session_ids:
        return {}
    stmt = select(AgentSession.id, live_status()).where(AgentSession.id.in_(session_ids))
    return {sid: status for sid, status in (await db.execute(stmt)).all()}


