"""One session, one writer: a session is *leased* to the turn, compaction, delete or forget working on it.

The lease (owner, expiry, the epoch it was taken at) is taken in a short transaction and renewed by a heartbeat
while the work runs; the model call and a forget's replay run outside any database transaction, so no connection is
held and no transaction stays open (VACUUM, which finally removes forgotten values, is never held back by one). The
work's writes commit in one transaction that locks the row and checks the lease is still the taker's and the epoch
the one leased (`Lease.commit`): a holder that stalled past its expiry, and whose session another process took over,
writes nothing and answers 409. A dead process's lease expires and the next request takes the session over.

Waiting for a session: requests of one process queue on an in-process lock first, so a waiter holds no pooled
connection and the process asks the database for the lease once; a session leased by another process is polled for
(with backoff) until the caller's bound, then 409 session_busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.database import Database
from app.db.models import AgentSession
from app.engine.session_caches import SessionCaches
from app.errors import NotFound, SessionBusy
from app.keys.content import Sealer
from app.runtime.routing import session_route
from app.sessions.repositories import leases as leases_repo
from app.sessions.repositories import sessions as sessions_repo

log = logging.getLogger(__name__)

DEFAULT_LOCK_TIMEOUT_S = 30.0  # longer than a typical turn, so turns queued behind one another do not fail
DEFAULT_LEASE_S = 15.0  # how long a dead process keeps its sessions; the heartbeat renews a live one at a third
POLL_FIRST_S, POLL_MAX_S = 0.02, 0.25  # waiting for another process's lease: backoff between looks


async def require(tx: AsyncSession, sealer: Sealer, tenant_id: str, session_id: str) -> AgentSession:
    """The tenant's session (404 for an unknown id or another tenant's)."""
    row = await sessions_repo.get(tx, sealer, tenant_id, session_id)
    if row is None:
        raise NotFound(f"no session {session_id!r}")
    return row


class LeaseLost(SessionBusy):
    """The lease ran out and another process took the session over while this one worked: nothing was written."""


@dataclass
class Lease:
    """A session leased to this process's current work. `row` is the session as last committed under the lease."""

    db: Database
    sealer: Sealer
    row: AgentSession
    owner: str
    lost: bool = field(default=False)

    @asynccontextmanager
    async def commit(self) -> AsyncIterator[tuple[AsyncSession, AgentSession]]:
        """A transaction in which the session is still this lease's: its row locked (for this commit only) and
        checked to be held by this owner at the epoch leased (LeaseLost otherwise, with nothing written)."""
        async with self.db.transaction() as tx:
            row = await leases_repo.lock_held(tx, self.sealer, self.row.id, self.owner)
            if row is None or row.epoch != self.row.epoch:
                self.lost = True
                raise LeaseLost(
                    f"session {self.row.id!r} was taken over while this request worked on it (its lease expired); "
                    "nothing was written, retry",
                    headers={"Retry-After": "2"},
                )
            yield tx, row
        self.row = row

    def reads(self) -> contextlib.AbstractAsyncContextManager[AsyncSession]:
        """A short transaction to read the session's state: under the lease nothing else writes it."""
        return self.db.transaction()


class SessionLocks:
    def __init__(
        self,
        db: Database,
        sealer: Sealer,
        handles: SessionCaches,
        timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
        *,
        lease_s: float = DEFAULT_LEASE_S,
        on_wait: Callable[[int], None] | None = None,
    ) -> None:
        self.db = db
        self.sealer = sealer
        self.handles = handles
        self.timeout_s = timeout_s
        self.lease_s = lease_s
        self.on_wait = on_wait  # told +1 / -1 as a request starts and stops waiting for a session (a gauge)
        self.process = f"{os.getpid()}"
        self._turn_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def _turn_lock(self, session_id: str) -> asyncio.Lock:
        """The in-process lock a session's requests queue on before they ask the database for its lease."""
        lock = self._turn_locks.get(session_id)
        if lock is None:
            lock = self._turn_locks[session_id] = asyncio.Lock()
        return lock

    @asynccontextmanager
    async def leased(
        self, tenant_id: str, session_id: str, status: str = "running", timeout_s: float | None = None
    ) -> AsyncIterator[Lease]:
        """The session to oneself for the block (waiting at most `timeout_s`, the service's bound by default, for
        this process's queue and another process's lease together); the lease is released on exit."""
        async with self._queued(tenant_id, session_id, timeout_s) as deadline:
            lease = await self._take(tenant_id, session_id, status, deadline)
            heartbeat = asyncio.create_task(self._renew(lease))
            try:
                yield lease
            finally:
                heartbeat.cancel()
                # Shielded: a request cancelled (its client hung up) still lets the session go at once.
                await asyncio.shield(self._release(lease))

    @asynccontextmanager
    async def _queued(self, tenant_id: str, session_id: str, timeout_s: float | None) -> AsyncIterator[float]:
        """Wait in this process's queue for the session (bounded); yields the deadline left for the lease.

        Only the session's own tenant queues: another tenant's request on the id answers 404 at once, instead of
        waiting behind (or delaying) the owner's turns and answering 409, which would tell it the session exists."""
        async with self.db.transaction() as tx:
            await require(tx, self.sealer, tenant_id, session_id)
        bound = self.timeout_s if timeout_s is None else timeout_s
        deadline = asyncio.get_running_loop().time() + bound
        turn_lock = self._turn_lock(session_id)
        try:
            if turn_lock.locked():
                async with self._waiting():
                    await asyncio.wait_for(turn_lock.acquire(), bound)
            else:
                await turn_lock.acquire()
        except TimeoutError:
            raise _busy(session_id) from None
        try:
            yield deadline
        finally:
            turn_lock.release()

    async def _take(self, tenant_id: str, session_id: str, status: str, deadline: float) -> Lease:
        owner = f"{self.process}:{secrets.token_hex(8)}"  # this process, this piece of work
        pause = POLL_FIRST_S
        loop = asyncio.get_running_loop()
        waiting = contextlib.AsyncExitStack()
        async with waiting:
            while True:
                async with self.db.transaction() as tx:
                    row = await leases_repo.take(tx, self.sealer, tenant_id, session_id, owner, self.lease_s, status)
                    gone = row is None and await sessions_repo.get(tx, self.sealer, tenant_id, session_id) is None
                    tenant = await sessions_repo.tenant_of(tx, session_id) if gone else None
                if gone:
                    await self._forget_handle_if_gone(tenant, tenant_id, session_id)
                    raise NotFound(f"no session {session_id!r}")
                if row is not None:
                    return Lease(self.db, self.sealer, row, owner)
                left = deadline - loop.time()
                if left <= 0:
                    raise _busy(session_id)
                if pause == POLL_FIRST_S:
                    await waiting.enter_async_context(self._waiting())
                await asyncio.sleep(min(pause, left))  # another process holds it: look again, backing off
                pause = min(pause * 2, POLL_MAX_S)

    async def _forget_handle_if_gone(self, owner: str | None, tenant_id: str, session_id: str) -> None:
        # Deleted elsewhere (no owner left): this process's handle is garbage now. Only then: a request naming another
        # tenant's session must leave everything of it alone, its cache handle included.
        if owner is None:
            await self.handles.drop(session_route(tenant_id, session_id))

    async def _renew(self, lease: Lease) -> None:
        while not lease.lost:
            await asyncio.sleep(self.lease_s / 3)
            try:
                async with self.db.transaction() as tx:
                    if not await leases_repo.renew(tx, lease.row.id, lease.owner, self.lease_s):
                        lease.lost = True  # the commit will refuse; nothing more to renew
            except Exception as exc:  # a database hiccup: the next beat tries again before the lease runs out
                log.warning("session lease renewal failed", extra={"session_id": lease.row.id,
                                                                   "error": type(exc).__name__})

    async def _release(self, lease: Lease) -> None:
        try:
            async with self.db.transaction() as tx:
                await leases_repo.release(tx, lease.row.id, lease.owner)
        except Exception as exc:  # the lease then expires by itself
            log.warning("session lease release failed", extra={"session_id": lease.row.id,
                                                               "error": type(exc).__name__})

    @asynccontextmanager
    async def _waiting(self) -> AsyncIterator[None]:
        if self.on_wait is not None:
            self.on_wait(1)
        try:
            yield
        finally:
            if self.on_wait is not None:
                self.on_wait(-1)


def _busy(session_id: str) -> SessionBusy:
    return SessionBusy(
        f"session {session_id!r} is busy (a turn or a forget is running on it); retry later",
        headers={"Retry-After": "2"},
    )
