"""The database handle owned by the app's lifespan: one async engine, one session factory."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from app.db.embedded import start_embedded_postgres, to_async_url
from app.db.statements import OnConnection, Sql
from app.settings import Settings

APPLICATION_NAME = "lethe"  # how the service's connections show in pg_stat_activity


class Database:
    def __init__(self, url: str, *, pool_size: int = 10) -> None:
        self.url = to_async_url(url)
        self.engine: AsyncEngine = create_async_engine(
            # hide_parameters: a failing statement must not put memory values or artifact text into the log.
            # No pool_pre_ping: it cost a round trip per checkout, a quarter of the memory API's server time (py-spy).
            # A connection found dead instead fails its request with 503 (app/api/problems.py), and SQLAlchemy then
            # replaces every pooled connection older than the failure, so one outage costs one 503 per process.
            self.url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=False, hide_parameters=True,
            connect_args={"server_settings": {"application_name": APPLICATION_NAME}},
        )
        self.sessions = async_sessionmaker(self.engine, expire_on_commit=False)
        self._single = async_sessionmaker(self.engine.execution_options(isolation_level="AUTOCOMMIT"),
                                          expire_on_commit=False)
        self._pg_url = self.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._pg_size = pool_size
        self._pg: asyncpg.Pool | None = None
        self._pg_lock = asyncio.Lock()

    @property
    def pg_url(self) -> str:
        """The database's URL as asyncpg takes it (a LISTEN connection of its own: app/db/notifications.py)."""
        return self._pg_url

    @asynccontextmanager
    async def pg(self) -> AsyncIterator[Sql]:
        """A plain asyncpg connection for a hot path's statements (app/db/statements.py), no transaction open: each
        statement commits on its own. Its own pool beside SQLAlchemy's, sized alike; opened on first use."""
        pool = self._pg or await self._open_pg()
        async with pool.acquire() as connection:
            yield OnConnection(connection)

    @asynccontextmanager
    async def pg_transaction(self) -> AsyncIterator[Sql]:
        """`pg()` inside one transaction: committed when the block ends, rolled back on any error."""
        pool = self._pg or await self._open_pg()
        async with pool.acquire() as connection, connection.transaction():
            yield OnConnection(connection)

    async def _open_pg(self) -> asyncpg.Pool:
        async with self._pg_lock:
            if self._pg is None:
                self._pg = await asyncpg.create_pool(
                    self._pg_url, min_size=1, max_size=self._pg_size, init=_jsonb_as_json,
                    server_settings={"application_name": APPLICATION_NAME},
                    # A release would otherwise also reset session state (RESET ALL, UNLISTEN, ...): a round trip
                    # per request for state these statements never set. An open transaction is still rolled back.
                    reset=_nothing_to_reset,
                )
            return self._pg

    @asynccontextmanager
    async def single_statement(self) -> AsyncIterator[AsyncSession]:
        """For a unit of work that is one read statement: PostgreSQL runs a lone statement in a snapshot of its own,
        so BEGIN and COMMIT (two round trips of four on a memory read) add nothing."""
        async with self._single() as session:
            yield session

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        """One unit of work: commit on success, roll back on any error, cancellation included."""
        async with self.sessions() as session, session.begin():
            yield session

    async def ping(self) -> bool:
        try:
            async with self.engine.connect() as conn:
                await asyncio.wait_for(conn.execute(text("SELECT 1")), timeout=2)
            return True
        except Exception:
            return False

    async def close(self) -> None:
        if self._pg is not None:
            await self._pg.close()
        await self.engine.dispose()


async def _jsonb_as_json(connection: asyncpg.Connection) -> None:
    await connection.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def _nothing_to_reset(connection: asyncpg.Connection) -> None:
    return None


async def resolve_database_url(settings: Settings) -> str:
    """The external URL when configured, else the embedded server's (started off the event loop)."""
    if settings.database_url is not None:
        return settings.database_url.get_secret_value()
    return await asyncio.to_thread(start_embedded_postgres, settings.data_dir)
