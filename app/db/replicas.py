"""Reads on PostgreSQL streaming replicas, never older than the consistency token they carry.

A read that may leave the primary (`ReadFrom.replica`) is tried on the replicas in turn (round robin, skipping one
that failed within the last `DOWN_S`). Without a token any replica serves it: eventually consistent, as far behind
as the replica lags (`lethe_replica_lag_*`). With a token, the replica's position is read on the very connection
that will run the read (app/db/wal.py), and the read runs there only if the replica is on the token's
cluster and timeline and has replayed past it; a replica behind it is polled until the read's bound
(`LETHE_REPLICA_WAIT_MS`), then the read goes to the primary. Any failure of a replica (refused, lost, restarting,
a query cancelled by replay) sends the read to the primary as well, so a replica can make a read slower, never wrong
and never an error. Reads are idempotent, so one that failed half-way on a replica simply runs again on the primary.

`Replicas` only knows replicas: it answers or raises `ReplicaMiss`, and `Database` (session.py) then reads the
primary and counts where each read went.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

import asyncpg
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from app.db import wal
from app.db.consistency import ConsistencyToken
from app.db.embedded import to_async_url
from app.db.pools import open_pg_pool
from app.db.statements import InSession, OnConnection, Sql

log = logging.getLogger(__name__)

T = TypeVar("T")
_S = TypeVar("_S")  # what a read works on: an asyncpg connection's Sql, or an ORM session

DOWN_S = 1.0  # a replica that failed is left alone this long (then one read, or the watch, tries it again)
CONNECT_TIMEOUT_S = 2.0  # a replica host that does not answer must not hold a read longer than this
FIRST_POLL_S, MAX_POLL_S = 0.001, 0.02  # a tokened read waiting for replay looks again, backing off


@dataclass(frozen=True)
class ReplicaConfig:
    urls: tuple[str, ...]
    wait_s: float = 0.2
    probe_s: float = 5.0
    pool_size: int = 10


class ReplicaMiss(Exception):
    """No replica could serve the read; `reason` says why (a label of `lethe_reads_total`)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def replica_failed(exc: BaseException) -> bool:
    """Whether `exc` came from the replica's side, its connection or its database (down, restarting, a query
    cancelled by replay, a replica that lacks the schema), rather than from the request's own logic: the primary then
    answers instead, and authoritatively (an error that is really the read's fails there too, and is raised there).
    asyncpg's InternalClientError counts: a replica killed under a query can leave its connection's protocol mid-way
    ("cannot switch to state 12; another operation (2) is in progress", seen in CI), and that connection is unusable,
    whatever the read was."""
    return isinstance(
        exc,
        OSError | TimeoutError | asyncpg.PostgresError | asyncpg.InterfaceError | asyncpg.InternalClientError
        | SQLAlchemyError,
    )


class _Memo(Protocol):
    """Where a connection keeps the position its server had last time it was asked (None: never asked)."""

    def seen(self) -> wal.Position | None: ...

    def saw(self, position: wal.Position) -> None: ...


class _RememberingConnection(asyncpg.Connection):  # type: ignore[misc]
    """A replica connection that remembers its server's position when last asked. A server's replay only moves
    forward while it runs, and a connection dies with its server (a restarted replica may reopen *behind* where it
    was, at its last consistent point), so a token at or below what this connection saw needs no new look."""

    __slots__ = ("_position",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._position: wal.Position | None = None

    def seen(self) -> wal.Position | None:
        return self._position

    def saw(self, position: wal.Position) -> None:
        self._position = position


class _NoMemo:
    """An ORM session's connection keeps nothing (its reads are heavier; one more look costs little there)."""

    def seen(self) -> wal.Position | None:
        return None

    def saw(self, position: wal.Position) -> None:
        return None


class Replica:
    """One replica: an asyncpg pool for the hot path and a SQLAlchemy engine for ORM reads, both opened on first use
    and neither connecting before a read needs it (a replica that is down at start costs nothing)."""

    def __init__(self, index: int, url: str, pool_size: int, application_name: str) -> None:
        self.label = str(index)  # metrics name replicas by position, never by URL (it may hold a password)
        self.orm_url = to_async_url(url)
        self._pool_size = pool_size
        self._application_name = application_name
        self._pool: asyncpg.Pool | None = None
        self._pool_lock = asyncio.Lock()
        self._engine: AsyncEngine | None = None
        self._sessions: async_sessionmaker[AsyncSession] | None = None
        self.down_until = 0.0

    def usable(self, now: float) -> bool:
        return now >= self.down_until

    def failed(self, exc: BaseException) -> None:
        if self.down_until <= time.monotonic():
            log.warning("replica unavailable; reads go elsewhere", extra={"replica": self.label,
                                                                          "error": type(exc).__name__})
        self.down_until = time.monotonic() + DOWN_S

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[tuple[Sql, Sql, _Memo]]:
        """(what the read works on, where its position is read, the connection's memo): an asyncpg connection."""
        pool = self._pool or await self._open_pool()
        async with pool.acquire() as connection:  # a proxy: `seen`/`saw` reach the _RememberingConnection
            sql = OnConnection(connection)
            yield sql, sql, cast(_Memo, connection)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[tuple[AsyncSession, Sql, _Memo]]:
        """A unit of work for reads, as `Database.transaction` gives one on the primary (a standby refuses writes)."""
        if self._sessions is None:
            self._engine = create_async_engine(
                self.orm_url, pool_size=self._pool_size, max_overflow=self._pool_size, pool_pre_ping=False,
                hide_parameters=True,
                connect_args={"timeout": CONNECT_TIMEOUT_S,
                              "server_settings": {"application_name": self._application_name}},
            )
            self._sessions = async_sessionmaker(self._engine, expire_on_commit=False)
        async with self._sessions() as session, session.begin():
            yield session, InSession(session), _NoMemo()

    async def _open_pool(self) -> asyncpg.Pool:
        async with self._pool_lock:
            if self._pool is None:
                url = self.orm_url.replace("postgresql+asyncpg://", "postgresql://", 1)
                self._pool = await open_pg_pool(
                    url, self._pool_size, min_size=0, connect_timeout_s=CONNECT_TIMEOUT_S,
                    connection_class=_RememberingConnection,
                )
            return self._pool

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
        if self._engine is not None:
            await self._engine.dispose()


class Replicas:
    def __init__(self, config: ReplicaConfig, application_name: str) -> None:
        self.config = config
        self.members = [
            Replica(i, url, config.pool_size, application_name) for i, url in enumerate(config.urls)
        ]
        self._next = 0

    def _rotation(self) -> list[Replica]:
        """The replicas to try, starting one further along each time (round robin), skipping those left alone."""
        start = self._next
        self._next = (start + 1) % len(self.members)
        now = time.monotonic()
        ordered = self.members[start:] + self.members[:start]
        return [r for r in ordered if r.usable(now)]

    async def run_pg(self, after: ConsistencyToken | None, work: Callable[[Sql], Awaitable[T]]) -> T:
        """`work` on a replica's asyncpg connection, or ReplicaMiss."""
        return await self._run(after, work, lambda r: r.connection())

    async def run_orm(self, after: ConsistencyToken | None, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
        """`work` in a read-only ORM session on a replica, or ReplicaMiss."""
        return await self._run(after, work, lambda r: r.session())

    async def _run(
        self,
        after: ConsistencyToken | None,
        work: Callable[[_S], Awaitable[T]],
        open_: Callable[[Replica], contextlib.AbstractAsyncContextManager[tuple[_S, Sql, _Memo]]],
    ) -> T:
        deadline = time.monotonic() + self.config.wait_s
        reason = "replica_down"
        for replica in self._rotation():
            try:
                async with open_(replica) as (handle, sql, memo):
                    missed = await self._behind(sql, memo, after, deadline)
                    if missed is None:
                        return await work(handle)
                    reason = missed
            except Exception as exc:
                if not replica_failed(exc):
                    raise
                replica.failed(exc)
                reason = "replica_down"
        raise ReplicaMiss(reason)

    @staticmethod
    async def _behind(sql: Sql, memo: _Memo, after: ConsistencyToken | None, deadline: float) -> str | None:
        """None when this server may serve a read that carries `after` (waiting for its replay until `deadline`),
        else why not: `other_timeline` (another cluster or timeline: no wait helps) or `lagging`."""
        if after is None:
            return None
        seen = memo.seen()
        if seen is not None and after.covered_by(seen.system_id, seen.timeline, seen.lsn):
            return None  # this connection's server was past the token already
        pause = FIRST_POLL_S
        while True:
            here = await wal.position(sql)
            memo.saw(here)
            covered = after.covered_by(here.system_id, here.timeline, here.lsn)
            if covered is None:
                return "other_timeline"
            if covered:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                return "lagging"
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, MAX_POLL_S)

    async def watch(
        self, head: Callable[[], Awaitable[int]], report: Callable[[str, bool, int | None, float | None], None]
    ) -> None:
        """Forever: every `probe_s`, each replica's lag behind the primary (bytes, and seconds since it last replayed
        a transaction while it is behind), given to `report(label, up, lag_bytes, lag_seconds)`. A replica that
        answers is usable again at once; one that does not is left alone like after a failed read."""
        while True:
            try:
                primary_at: int | None = await head()
            except Exception:
                primary_at = None
            for replica in self.members:
                await self._probe(replica, primary_at, report)
            await asyncio.sleep(self.config.probe_s)

    @staticmethod
    async def _probe(
        replica: Replica, primary_at: int | None, report: Callable[[str, bool, int | None, float | None], None]
    ) -> None:
        try:
            async with replica.connection() as (sql, _, _):
                state = await asyncio.wait_for(wal.replay(sql), CONNECT_TIMEOUT_S)
        except Exception as exc:
            replica.failed(exc)
            report(replica.label, False, None, None)
            return
        replica.down_until = 0.0
        if state.replayed is None or primary_at is None:  # promoted (it is a primary now), or the primary is down
            report(replica.label, True, 0 if state.replayed is None else None, 0.0 if state.replayed is None else None)
            return
        behind = max(0, primary_at - state.replayed)
        report(replica.label, True, behind, 0.0 if behind == 0 else state.since_last_replay_s)

    async def close(self) -> None:
        await asyncio.gather(*(r.close() for r in self.members), return_exceptions=True)



def parse_urls(value: str | None) -> Sequence[str]:
    """`LETHE_DATABASE_REPLICA_URLS`: comma-separated, blanks ignored."""
    return [part.strip() for part in (value or "").split(",") if part.strip()]
