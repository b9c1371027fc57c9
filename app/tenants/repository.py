"""SQL for tenants and their API keys."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AgentSession, ApiKey, Tenant
from app.ids import new_id


async def get_by_name(db: AsyncSession, name: str) -> Tenant | None:
    return (await db.execute(select(Tenant).where(Tenant.name == name))).scalar_one_or_none()


async def get(db: AsyncSession, tenant_id: str) -> Tenant | None:
    return await db.get(Tenant, tenant_id)


async def ensure(db: AsyncSession, name: str) -> Tenant:
    """Create the tenant if absent; safe when several processes bootstrap at once."""
    await db.execute(insert(Tenant).values(id=new_id("ten"), name=name).on_conflict_do_nothing(index_elements=["name"]))
    tenant = await get_by_name(db, name)
    assert tenant is not None
    return tenant


async def create(db: AsyncSession, name: str) -> Tenant | None:
    """Insert a new tenant; None when the name is taken."""
    row = await db.execute(
        insert(Tenant).values(id=new_id("ten"), name=name).on_conflict_do_nothing(index_elements=["name"])
        .returning(Tenant.id)
    )
    tenant_id = row.scalar_one_or_none()
    return None if tenant_id is None else await get(db, tenant_id)


async def every(db: AsyncSession, name: str | None = None) -> list[Tenant]:
    """Every tenant by name (or the one named `name`: none when there is no such tenant)."""
    query = select(Tenant).order_by(Tenant.name)
    if name is not None:
        query = query.where(Tenant.name == name)
    return list((await db.scalars(query)).all())


async def set_webhook_secret(db: AsyncSession, tenant_id: str, secret: str) -> None:
    await db.execute(update(Tenant).where(Tenant.id == tenant_id).values(webhook_secret=secret))


async def reserve_leaves(db: AsyncSession, tenant_id: str, count: int) -> int | None:
    """Take `count` leaves from the tenant's counter; answers the first (None: no such tenant). The row lock orders
    concurrent reservers, so their blocks never overlap; the caller commits at once (a rolled-back reservation would
    hand its numbers out again to the next reserver while this process still holds them)."""
    row = await db.execute(
        update(Tenant).where(Tenant.id == tenant_id).values(next_leaf=Tenant.next_leaf + count)
        .returning(Tenant.next_leaf)
    )
    end = row.scalar_one_or_none()
    return None if end is None else int(end) - count


async def add_key(db: AsyncSession, tenant_id: str, key_sha256: str, label: str | None) -> None:
    """Register a key hash; a hash already registered (bootstrap re-run) is left as it is."""
    await db.execute(
        insert(ApiKey).values(id=new_id("key"), tenant_id=tenant_id, key_sha256=key_sha256, label=label)
        .on_conflict_do_nothing(index_elements=["key_sha256"])
    )


async def tenant_for_key(db: AsyncSession, key_sha256: str) -> tuple[str, str] | None:
    """(tenant id, key id) of a live key."""
    row = (await db.execute(
        select(ApiKey.tenant_id, ApiKey.id).where(ApiKey.key_sha256 == key_sha256, ApiKey.revoked_at.is_(None))
    )).one_or_none()
    return None if row is None else (row[0], row[1])


async def webhook_owner(db: AsyncSession, session_id: str) -> tuple[str, str | None] | None:
    """(tenant id, webhook secret) of the tenant owning a session, for a detector webhook, which names a session and
    no tenant; None for an unknown session. The caller passes only an id it has checked (app/ids.py `plausible`)."""
    stmt = (
        select(Tenant.id, Tenant.webhook_secret)
        .join(AgentSession, AgentSession.tenant_id == Tenant.id)
        .where(AgentSession.id == session_id)
    )
    row = (await db.execute(stmt)).one_or_none()
    return None if row is None else (row[0], row[1])
