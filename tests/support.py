"""Constants and helpers shared by tests (import from here, not from conftest)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx

ROOT = Path(__file__).resolve().parents[1]
MODEL_CACHE = ROOT / ".lethe" / "models"
BOOTSTRAP_KEY = "test-bootstrap-key-" + "0" * 24
WEBHOOK_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PROBLEM = "application/problem+json"


def sql(database_url: str, query: str, *args: Any) -> list[asyncpg.Record]:
    """One query on its own connection: tests only look at the tables; behaviour goes through HTTP."""

    async def run() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(database_url)
        try:
            return list(await conn.fetch(query, *args))
        finally:
            await conn.close()

    return asyncio.run(run())


def problem(response: httpx.Response, status: int) -> dict[str, Any]:
    """Assert a problem+json answer with `status`; return its body."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith(PROBLEM), response.headers
    body: dict[str, Any] = response.json()
    assert body["status"] == status and body["type"] and body["title"]
    return body


# -- barriers: force a race instead of hoping for it --------------------------------------------------------------

POLL_S = 0.02  # how often a barrier looks again; it waits for an event, never for a length of time


async def wait_for_lock_waiters(watcher: asyncpg.Connection, count: int, limit_s: float = 60) -> None:
    """Until `count` backends are blocked on a lock: the only way to observe a request parked in the database."""
    deadline = time.monotonic() + limit_s
    query = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
    while await watcher.fetchval(query) < count:
        assert time.monotonic() < deadline, f"fewer than {count} requests ever blocked on a held lock"
        await asyncio.sleep(POLL_S)


class HeldLock:
    """A row lock taken by the test on a connection of its own, held until `release()` (or the `with` block ends).

    Take it on a row the code under test must write *inside* the critical section being raced (a forget's swap
    deletes its target artifact while it holds the session): once `wait_blocked()` returns, that code is provably
    parked there, holding everything it took before, and stays parked until the test lets it go."""

    def __init__(self, database_url: str, query: str, *args: Any) -> None:
        self.database_url = database_url
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._conn: asyncpg.Connection | None = None
        self._tx: Any = None
        self.pid = self._call(self._take(query, *args))

    def _call(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _take(self, query: str, *args: Any) -> int:
        self._conn = await asyncpg.connect(self.database_url)
        self._tx = self._conn.transaction()
        await self._tx.start()
        rows = await self._conn.fetch(query, *args)
        assert rows, f"the lock query matched no row: {query} {args}"
        return int(self._conn.get_server_pid())

    def blocked(self) -> int:
        """How many backends wait for this lock now."""
        query = "SELECT count(*) AS n FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))"
        rows = sql(self.database_url, query, self.pid)
        return int(rows[0]["n"])

    def wait_blocked(self, count: int = 1, limit_s: float = 180) -> None:
        deadline = time.monotonic() + limit_s
        while self.blocked() < count:
            assert time.monotonic() < deadline, f"fewer than {count} backends ever waited for the held lock"
            time.sleep(POLL_S)

    def release(self) -> None:
        if self._conn is None:
            return
        conn, self._conn = self._conn, None

        async def close() -> None:
            await self._tx.rollback()
            await conn.close()

        self._call(close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> HeldLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def in_flight(client: httpx.Client) -> int:
    """Requests the server is serving now, this /metrics request included."""
    text = client.get("/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("lethe_http_requests_in_flight "))
    return int(float(line.split()[1]))


def wait_in_flight(client: httpx.Client, count: int, limit_s: float = 60) -> None:
    """Until `count` other requests are being served: those the test started are provably inside the server."""
    deadline = time.monotonic() + limit_s
    while in_flight(client) < count + 1:
        assert time.monotonic() < deadline, f"fewer than {count} requests ever reached the server"
        time.sleep(POLL_S)
