"""One session, one writer: a bounded wait in this process's queue, then the session row locked in a transaction.

The row lock is what serializes turns (and deletes, and forgets) on a session across every API process on the
database; it is held for the whole transaction, model call included. Queueing a process's own requests on an
in-process lock first keeps each waiter from holding a pooled connection while it waits. A waiter past its bound
gets 409 session_busy.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AgentSession
from app.db.repositories import sessions as sessions_repo
from app.db.session import Database
from app.errors import NotFound, SessionBusy
from app.runtime.handles import HandleRegistry

DEFAULT_LOCK_TIMEOUT_S = 30.0  # longer than a typical turn, so turns queued behind one another do not fail


async def require(tx: AsyncSession, tenant_id: str, session_id: str) -> AgentSession:
    """The tenant's session (404 for an unknown id or another tenant's)."""
    row = await sessions_repo.get(tx, tenant_id, session_id)
    if row is None:
        raise NotFound(f"no session {session_id!r}")
    return row


class SessionLocks:
    def __init__(self, db: Database, handles: HandleRegistry, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> None:
        self.db = db
        self.handles = handles
        self.timeout_s = timeout_s

    @asynccontextmanager
    async def held(
        self, tenant_id: str, session_id: str, timeout_s: float | None = None
    ) -> AsyncIterator[tuple[AsyncSession, AgentSession]]:
        """The session to oneself: its row locked in a transaction that commits on exit (waiting at most
        `timeout_s`, the service's bound by default, for the queue and the lock together)."""
        async with self._queued(tenant_id, session_id, timeout_s) as deadline, self.db.transaction() as tx:
            yield tx, await self._lock(tx, tenant_id, session_id, deadline)

    @asynccontextmanager
    async def _queued(self, tenant_id: str, session_id: str, timeout_s: float | None) -> AsyncIterator[float]:
        """Wait in this process's queue for the session (bounded); yields the deadline left for the row lock.

        Only the session's own tenant queues: another tenant's request on the id answers 404 at once, instead of
        waiting behind (or delaying) the owner's turns and answering 409, which would tell it the session exists."""
        async with self.db.transaction() as tx:
            await require(tx, tenant_id, session_id)
        bound = self.timeout_s if timeout_s is None else timeout_s
        deadline = asyncio.get_running_loop().time() + bound
        turn_lock = self.handles.turn_lock(session_id)
        try:
            await asyncio.wait_for(turn_lock.acquire(), bound)
        except TimeoutError:
            raise _busy(session_id) from None
        try:
            yield deadline
        finally:
            turn_lock.release()

    async def _lock(self, tx: AsyncSession, tenant_id: str, session_id: str, deadline: float) -> AgentSession:
        left = max(0.05, deadline - asyncio.get_running_loop().time())
        try:
            row = await sessions_repo.lock(tx, tenant_id, session_id, left)
        except sessions_repo.LockTimeout:
            raise _busy(session_id) from None
        if row is None:
            # Deleted elsewhere: this process's handle is garbage now. Only then: a request naming another
            # tenant's session must leave everything of it alone, its cache handle included.
            if await sessions_repo.tenant_of(tx, session_id) is None:
                self.handles.pop(session_id)
            raise NotFound(f"no session {session_id!r}")
        return row


def _busy(session_id: str) -> SessionBusy:
    return SessionBusy(
        f"session {session_id!r} is busy (a turn or a forget is running on it); retry later",
        headers={"Retry-After": "2"},
    )
