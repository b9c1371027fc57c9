"""Fixtures for the memory tests: a fresh namespace per test, a second tenant, the Python client.

Direct SQL (tests/memory/memory_helpers.py) is only ever used to *look* at what the tables hold, or to hold a row
lock so a request is provably in flight; every behaviour under test goes through HTTP against the live server.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.client import LetheClient
from app.db.session import Database
from app.tenants.service import TenantService
from tests.support import BOOTSTRAP_KEY

LiveServer = Any  # tests/conftest.py's class; fixtures are not imported from a conftest


@pytest.fixture
def ns() -> str:
    """A namespace of this test's own, so tests sharing the run's database never see each other's keys."""
    return "t-" + uuid.uuid4().hex[:12]


@pytest.fixture(scope="session")
def other_tenant_key(live_server: LiveServer, database_url: str) -> str:
    """An API key of a second tenant on the same database, created the way `lethe tenant create` does.

    Depends on the live server so the schema is migrated first."""

    async def create_tenant() -> str:
        db = Database(database_url, pool_size=1)
        try:
            _, key = await TenantService(db).create_tenant("memory-other-" + uuid.uuid4().hex[:8])
        finally:
            await db.close()
        return key

    return asyncio.run(create_tenant())


@pytest.fixture
def other(live_server: LiveServer, other_tenant_key: str) -> Iterator[httpx.Client]:
    """An HTTP client authenticated as the second tenant."""
    headers = {"Authorization": f"Bearer {other_tenant_key}"}
    with httpx.Client(base_url=live_server.base_url, headers=headers, timeout=60) as c:
        yield c


@pytest.fixture
def api_key() -> str:
    """The bootstrap key the shared `client` fixture authenticates with."""
    return BOOTSTRAP_KEY


@pytest.fixture
def lethe(live_server: LiveServer, api_key: str) -> Iterator[LetheClient]:
    with LetheClient(live_server.base_url, api_key, timeout=60) as lethe_client:
        yield lethe_client
