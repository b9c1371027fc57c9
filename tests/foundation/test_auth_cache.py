"""A process remembers a verified API key for LETHE_AUTH_CACHE_S seconds: a revoked key stops working within that
bound (the clock is advanced, not waited for), at once when the cache is off, and an unknown key is never remembered.
Real PostgreSQL; the revocation is the column a key's revocation sets."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from app.db.database import Database
from app.errors import Unauthorized
from app.tenants import service as tenants_module
from app.tenants.service import TenantService, hash_key
from tests.conftest import LiveServer
from tests.support import sql


def _revoke(database_url: str, key: str) -> None:
    sql(database_url, "UPDATE api_keys SET revoked_at = now() WHERE key_sha256 = $1", hash_key(key))


@pytest.fixture
def tenants(live_server: LiveServer, database_url: str) -> tuple[TenantService, TenantService, Database]:
    """Two services on one database handle, with and without the cache (the live server migrated the schema)."""
    db = Database(database_url, pool_size=2)
    return TenantService(db, auth_cache_s=5), TenantService(db, auth_cache_s=0), db


def test_a_revoked_key_stops_working_within_the_bound(
    tenants: tuple[TenantService, TenantService, Database], database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cached, uncached, db = tenants

    async def scenario() -> None:
        try:
            tenant_id, key = await cached.create_tenant("auth-" + uuid.uuid4().hex[:8])
            assert (await cached.authenticate(f"Bearer {key}")).tenant_id == tenant_id
            assert (await uncached.authenticate(f"Bearer {key}")).tenant_id == tenant_id
            await asyncio.to_thread(_revoke, database_url, key)
            with pytest.raises(Unauthorized):
                await uncached.authenticate(f"Bearer {key}")  # no cache: at once
            assert (await cached.authenticate(f"Bearer {key}")).tenant_id == tenant_id  # remembered, within 5 s
            now = time.monotonic()
            monkeypatch.setattr(tenants_module.time, "monotonic", lambda: now + 5.01)
            with pytest.raises(Unauthorized):
                await cached.authenticate(f"Bearer {key}")  # past the bound: asked again, refused
        finally:
            await db.close()

    asyncio.run(scenario())


def test_an_unknown_key_is_not_remembered(tenants: tuple[TenantService, TenantService, Database]) -> None:
    cached, _, db = tenants

    async def scenario() -> None:
        try:
            with pytest.raises(Unauthorized):
                await cached.authenticate("Bearer lethe_unknown")
            assert hash_key("lethe_unknown") not in cached._verified
        finally:
            await db.close()

    asyncio.run(scenario())
