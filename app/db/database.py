"""The database handle owned by the app's lifespan: one async engine, one session factory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from app.db import wal
from app.db.consistency import ConsistencyToken, ReadFrom
from app.db.embedded import start_embedded_postgres, to_async_url
from app.db.pools import APPLICATION_NAME, open_pg_pool
from app.db.replicas import ReplicaConfig, ReplicaMiss, Replicas, parse_urls
from app.db.statements import OnConnection, Sql
from app.observability.metrics import Metrics
from app.settings import Settings

__all__ = ["APPLICATION_NAME", "Database", "resolve_database_url"]

T = TypeVar("T")
# Strict forgets (LETHE_FORGET_REMOTE_APPLY): the commit returns once the synchronous standbys have applied it.
_REMOTE_APPLY = "SET LOCAL synchronous_commit = remote_apply"


class Database:
    def __init__(
        self, url: str, *, pool_size: int = 10, replicas: ReplicaConfig | None = None, strict_forgets: bool = False,
        metrics: Metrics | None = None,
    ) -> None:
        self.url = to_async_url(url)
        self.engine: AsyncEngine = create_async_engine(
            # hide_parameters: a failing statement must not put memory values or artifact text into the log.
            # No pool_pre_ping: it cost a round trip per checkout, a quarter of the memory API's server time (py-spy).
            # A connection found dead instead fails its request with 503 (app/web/problems.py), and SQLAlchemy then
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
        self.replicas = (
            Replicas(replicas, APPLICATION_NAME) if replicas is not None and replicas.urls else None
        )
        self.strict_forgets = strict_forgets
        self.metrics = metrics

    @classmethod
    def from_settings(cls, url: str, settings: Settings, *, metrics: Metrics | None = None) -> Database:
        """The service's database: the primary at `url`, the replicas and strict forgets as configured."""
        urls = parse_urls(settings.database_replica_urls.get_secret_value() if settings.database_replica_urls else None)
        config = ReplicaConfig(
            urls=tuple(urls), wait_s=settings.replica_wait_ms / 1000, probe_s=settings.replica_probe_s,
            pool_size=settings.db_pool_size,
        )
        return cls(url, pool_size=settings.db_pool_size, replicas=config, strict_forgets=settings.forget_remote_apply,
                   metrics=metrics)

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
    async def pg_transaction(self, *, forget: bool = False) -> AsyncIterator[Sql]:
        """`pg()` inside one transaction: committed when the block ends, rolled back on any error. `forget`: the
        transaction commits a forget (strict forgets wait for the synchronous standbys to apply it)."""
        pool = self._pg or await self._open_pg()
        async with pool.acquire() as connection, connection.transaction():
            if forget and self.strict_forgets:
                await connection.execute(_REMOTE_APPLY)
            yield OnConnection(connection)

    async def _open_pg(self) -> asyncpg.Pool:
        async with self._pg_lock:
            if self._pg is None:
                self._pg = await open_pg_pool(self._pg_url, self._pg_size)
            return self._pg

    @asynccontextmanager
    async def single_statement(self) -> AsyncIterator[AsyncSession]:
        """For a unit of work that is one read statement: PostgreSQL runs a lone statement in a snapshot of its own,
        so BEGIN and COMMIT (two round trips of four on a memory read) add nothing."""
        async with self._single() as session:
            yield session

    @asynccontextmanager
    async def transaction(self, *, forget: bool = False) -> AsyncIterator[AsyncSession]:
        """One unit of work: commit on success, roll back on any error, cancellation included. `forget`: as in
        `pg_transaction`."""
        async with self.sessions() as session, session.begin():
            if forget and self.strict_forgets:
                await session.execute(text(_REMOTE_APPLY))
            yield session

    # ---- reads that a replica may serve (app/db/replicas.py) ------------------------------------------------------

    async def read(self, where: ReadFrom, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
        """`work` (reads only) in an ORM unit of work on the primary or, as `where` allows, on a replica."""
        if where.replica and self.replicas is not None:
            try:
                result = await self.replicas.run_orm(where.after, work)
            except ReplicaMiss as miss:
                self._served("primary", miss.reason)
            else:
                self._served("replica", "token" if where.after else "untokened")
                return result
        async with self.transaction() as session:
            return await work(session)

    async def read_pg(self, where: ReadFrom, work: Callable[[Sql], Awaitable[T]]) -> T:
        """`work` (reads only) on a hot-path connection (`pg()`) of the primary or, as `where` allows, a replica."""
        if where.replica and self.replicas is not None:
            try:
                result = await self.replicas.run_pg(where.after, work)
            except ReplicaMiss as miss:
                self._served("primary", miss.reason)
            else:
                self._served("replica", "token" if where.after else "untokened")
                return result
        async with self.pg() as sql:
            return await work(sql)

    def _served(self, by: str, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.reads.labels(served_by=by, reason=reason).inc()

    async def consistency_token(self) -> ConsistencyToken:
        """The primary's position now: at or past the commit of everything that committed before this call, so a
        read carrying it sees all of that (the `Lethe-Consistency` of a write's answer)."""
        async with self.pg() as sql:
            return (await wal.position(sql)).token()

    async def watch_replicas(self) -> None:
        """Forever, while replicas are configured: their lag, as the metrics `lethe_replica_*` (a lifespan task)."""
        if self.replicas is None:
            return

        async def head() -> int:
            async with self.pg() as sql:
                return await wal.head(sql)

        await self.replicas.watch(head, self._report_replica)

    def _report_replica(self, label: str, up: bool, lag_bytes: int | None, lag_seconds: float | None) -> None:
        if self.metrics is not None:
            self.metrics.replica_state(label, up=up, lag_bytes=lag_bytes, lag_seconds=lag_seconds)

    async def ping(self) -> bool:
        try:
            async with self.engine.connect() as conn:
                await asyncio.wait_for(conn.execute(text("SELECT 1")), timeout=2)
            return True
        except Exception:
            return False

    async def close(self) -> None:
        if self.replicas is not None:
            await self.replicas.close()
        if self._pg is not None:
            await self._pg.close()
        await self.engine.dispose()


async def resolve_database_url(settings: Settings) -> str:
    """The external URL when configured, else the embedded server's (started off the event loop)."""
    if settings.database_url is not None:
        return settings.database_url.get_secret_value()
    return await asyncio.to_thread(start_embedded_postgres, settings.data_dir)
