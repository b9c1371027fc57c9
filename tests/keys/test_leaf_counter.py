"""A tenant's leaf counter in PostgreSQL (migration 0015): reservations never overlap, across processes and whatever
the caller's transaction does, and two processes' `Leaves` never hand out one leaf twice. Real PostgreSQL (the live
server migrated the schema)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text

from app.db.database import Database
from app.errors import NotFound
from app.keys.leaves import Leaves
from app.tenants import repository as repo
from app.tenants.service import TenantService
from tests.conftest import LiveServer


@pytest.fixture
async def service(live_server: LiveServer, database_url: str) -> AsyncIterator[TenantService]:
    db = Database(database_url, pool_size=3)
    try:
        yield TenantService(db, auth_cache_s=0)
    finally:
        await db.close()


async def _tenant(service: TenantService) -> str:
    tenant_id, _ = await service.create_tenant("leaves-" + uuid.uuid4().hex[:8])
    return tenant_id


async def test_reservations_are_disjoint_and_start_at_zero(service: TenantService) -> None:
    tenant_id = await _tenant(service)
    assert [await service.reserve_leaves(tenant_id, n) for n in (16, 1, 16)] == [0, 16, 17]
    other = await _tenant(service)
    assert await service.reserve_leaves(other, 16) == 0  # tenants count apart
    with pytest.raises(NotFound):
        await service.reserve_leaves("ten_" + "0" * 26, 16)
    with pytest.raises(ValueError):
        await service.reserve_leaves(tenant_id, 0)


async def test_a_reserver_waits_for_the_one_holding_the_row(service: TenantService) -> None:
    """Forced: A takes a block and holds its transaction open; B's reservation starts and is seen waiting on A's row
    lock (pg_locks, not a clock); A commits; B gets the block after A's."""
    tenant_id = await _tenant(service)
    db = service.db
    async with db.transaction() as a:
        first_a = await repo.reserve_leaves(a, tenant_id, 16)
        a_pid = (await a.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        b = asyncio.create_task(service.reserve_leaves(tenant_id, 16))
        async with db.transaction() as probe:
            while not (await probe.execute(
                text("SELECT count(*) FROM pg_locks l WHERE NOT l.granted AND :pid = ANY(pg_blocking_pids(l.pid))"),
                {"pid": a_pid},
            )).scalar_one():
                assert not b.done()
                await asyncio.sleep(0)  # yields to B's task; the loop ends on the lock state, not a clock
    assert (first_a, await b) == (0, 16)


async def test_a_rolled_back_caller_does_not_give_its_leaves_back(service: TenantService) -> None:
    tenant_id = await _tenant(service)

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback):
        async with service.db.transaction():
            assert await service.reserve_leaves(tenant_id, 16) == 0
            raise Rollback
    assert await service.reserve_leaves(tenant_id, 16) == 16


async def test_two_processes_leaves_never_share_a_leaf(service: TenantService, database_url: str) -> None:
    """Two `Leaves` (as two processes keep) over one tenant's counter, streams interleaved under gather."""
    tenant_id = await _tenant(service)
    other_db = Database(database_url, pool_size=2)
    try:
        other = TenantService(other_db, auth_cache_s=0)
        first, second = Leaves(service.reserve_leaves, block=4), Leaves(other.reserve_leaves, block=4)
        handed = await asyncio.gather(
            *(leaves.next(tenant_id, f"ses_{i % 3}") for i in range(60) for leaves in (first, second))
        )
    finally:
        await other_db.close()
    assert len(set(handed)) == len(handed) == 120
