"""The database handle owned by the app's lifespan: one async engine, one session factory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from app.db.embedded import start_embedded_postgres, to_async_url
from app.settings import Settings


class Database:
    def __init__(self, url: str, *, pool_size: int = 10) -> None:
        self.url = to_async_url(url)
        self.engine: AsyncEngine = create_async_engine(
            # hide_parameters: a failing statement must not put memory values or artifact text into the log.
            self.url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True, hide_parameters=True
        )
        self.sessions = async_sessionmaker(self.engine, expire_on_commit=False)

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
        await self.engine.dispose()


async def resolve_database_url(settings: Settings) -> str:
    """The external URL when configured, else the embedded server's (started off the event loop)."""
    if settings.database_url is not None:
        return settings.database_url.get_secret_value()
    return await asyncio.to_thread(start_embedded_postgres, settings.data_dir)
