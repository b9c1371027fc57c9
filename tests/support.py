"""Constants and helpers shared by tests (import from here, not from conftest)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from bench.serve import LetheServer

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

POLL_S = 0.05  # how often a barrier looks again; it waits for an event, never for a length of time


# Backends waiting, directly or queued behind another waiter, for a lock that backend $1 holds. A second waiter on a
# row waits for the first one (which holds the row's tuple lock), not for the holder: hence the closure.
_WAITING_BEHIND = """
WITH RECURSIVE behind(pid) AS (
    SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND $1 = ANY(pg_blocking_pids(pid))
    UNION
    SELECT a.pid FROM pg_stat_activity a JOIN behind b ON b.pid = ANY(pg_blocking_pids(a.pid))
    WHERE a.wait_event_type = 'Lock'
)
SELECT count(*) AS n FROM behind
"""
_ACTIVITY = """
SELECT pid, state, wait_event_type, wait_event, pg_blocking_pids(pid) AS blocked_by, left(query, 100) AS query
FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
"""


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
        self._watcher: asyncpg.Connection | None = None  # looks at pg_stat_activity while the lock is held
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
        # One connection for every look: a connection per look would load the machine (and this process, where the
        # suite's server runs) while the code under test is working its way to the lock.
        self._watcher = await asyncpg.connect(self.database_url)
        return int(self._conn.get_server_pid())

    def blocked(self) -> int:
        """How many backends wait for this lock now (wait_event_type 'Lock' in pg_stat_activity), those queued
        behind another waiter included: each is a request provably parked in the database."""
        assert self._watcher is not None, "the lock was released"
        return int(self._call(self._watcher.fetchval(_WAITING_BEHIND, self.pid)))

    def wait_blocked(self, count: int = 1, limit_s: float = 600) -> None:
        """Until `count` backends wait behind this lock. It waits for that event, never for a length of time; from an
        async test, run it in a thread (`asyncio.to_thread`) so the test's own requests go on being sent."""
        deadline = time.monotonic() + limit_s
        while self.blocked() < count:
            if time.monotonic() > deadline:
                assert self._watcher is not None
                activity = self._call(self._watcher.fetch(_ACTIVITY))
                raise AssertionError(f"fewer than {count} backends ever waited for the held lock: {activity}")
            time.sleep(POLL_S)

    def release(self) -> None:
        if self._conn is None:
            return
        conn, watcher, self._conn, self._watcher = self._conn, self._watcher, None, None

        async def close() -> None:
            await self._tx.rollback()
            await conn.close()
            if watcher is not None:
                await watcher.close()

        self._call(close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> HeldLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


FOREIGN_LEASE = "another-process:test"


@contextmanager
def held_session(database_url: str, session_id: str, status: str = "running") -> Iterator[None]:
    """The session leased by "another API process" (what a turn or a forget there holds while it works on it) until
    the block ends; the lease is long enough never to expire during a test."""
    taken = sql(
        database_url,
        "UPDATE sessions SET lease_owner = $2, lease_expires_at = now() + interval '1 hour', status = $3 "
        "WHERE id = $1 AND (lease_owner IS NULL OR lease_expires_at <= now()) RETURNING id",
        session_id, FOREIGN_LEASE, status,
    )
    assert taken, f"session {session_id} is held already (or unknown)"
    try:
        yield
    finally:
        sql(database_url,
            "UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL, status = 'idle' "
            "WHERE id = $1 AND lease_owner = $2", session_id, FOREIGN_LEASE)


def waiters(base_url: str) -> int:
    """Requests the server at `base_url` has waiting for a session another request holds (its /metrics gauge)."""
    text = httpx.get(f"{base_url.rstrip('/')}/metrics", timeout=30).text
    line = next(x for x in text.splitlines() if x.startswith("lethe_session_waiters "))
    return int(float(line.split()[1]))


def wait_waiting(base_url: str, count: int = 1, limit_s: float = 300) -> None:
    """Until `count` requests wait for a held session in the server at `base_url`: they are provably parked there."""
    deadline = time.monotonic() + limit_s
    while waiters(base_url) < count:
        assert time.monotonic() < deadline, f"fewer than {count} requests ever waited for a session"
        time.sleep(POLL_S)


def lethe_serve(database_url: str, data_dir: Path, **env: str) -> LetheServer:
    """A second API process on the test database beside the suite's in-process server (call `wait_ready()`).

    Its requests wait for a session's lease in the database, not in the suite server's process: a turn it serves
    while the other process holds the session is counted in its `lethe_session_waiters` gauge (`wait_waiting`)."""
    return LetheServer(data_dir, None, LETHE_DATABASE_URL=database_url, LETHE_BOOTSTRAP_API_KEY=BOOTSTRAP_KEY, **env)


@contextmanager
def module_server(database_url: str, data_dir: Path, **env: str) -> Iterator[LetheServer]:
    """A ready `lethe serve` on the test database for a test module's clients (OpenAI SDKs, Node, MCP), stopped
    (SIGTERM, by its pid) after the block: one per module, as the house rules ask."""
    server = lethe_serve(database_url, data_dir, **env)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


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


def until(condition: Any, what: str, limit_s: float = 300) -> None:
    """Until `condition()` holds: it waits for a state, never for a length of time (`limit_s` only bounds a bug)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(POLL_S)


def rewired(container: Any, **settings: Any) -> Any:
    """The live app's container built again from its settings with `settings` changed (same database, engine, cache
    handles and embedder): the settings → services wiring `lethe serve` uses, with a knob turned for a test."""
    from app.container import Container

    return Container(
        settings=container.settings.model_copy(update=settings), db=container.db, metrics=container.metrics,
        engine=container.engine, tenants=container.tenants, handles=container.handles, embedder=container.embedder,
    )


def sealer_of(server: Any, db: Any) -> Any:
    """A `Sealer` over the live server's key store, with its own caches and leaves reserved through `db` (a
    `Database`): what another process of the same deployment has."""
    from app.keys.content import Sealer
    from app.keys.factory import build_keyring
    from app.keys.leaves import Leaves
    from app.tenants.service import TenantService

    return Sealer(build_keyring(server.app.state.container.settings), Leaves(TenantService(db).reserve_leaves))


def fresh_keyring(server: Any) -> Any:
    """A `Keyring` over the live server's key store with nothing cached: what a fresh process derives."""
    from app.keys.factory import build_keyring

    return build_keyring(server.app.state.container.settings)


def derives(keyring: Any, tenant_id: str, leaf: int) -> bool:
    """Whether `leaf` still derives a key (False: a shred punctured it)."""
    from app.keys.errors import Erased

    try:
        asyncio.run(keyring.cipher(tenant_id, leaf))
    except Erased:
        return False
    return True


def sweep_shreds(database_url: str, server: Any) -> None:
    """One sweep of pending shreds, as the forget worker runs it (the server's own may have run it first: a shred is
    idempotent)."""
    from app.db.database import Database
    from app.forget.shredding import Shredder

    async def sweep() -> None:
        db = Database(database_url, pool_size=1)
        try:
            await Shredder(db, sealer_of(server, db)).sweep()
        finally:
            await db.close()

    asyncio.run(sweep())


OverrideService = Callable[..., None]
"""The `override_service` fixture (tests/conftest.py): `override_service(dependency, service, **settings)`."""


def cache_key(database_url: str, session_id: str) -> str:
    """The key a session's cache handle is kept under (app/runtime/salts.py `route_of`)."""
    from app.runtime.routing import session_route

    [row] = sql(database_url, "SELECT tenant_id FROM sessions WHERE id = $1", session_id)
    return session_route(row["tenant_id"], session_id)



def stored_artifacts(database_url: str, where: str, *args: Any) -> list[dict[str, Any]]:
    """Rows of `artifacts` (`where`: the SQL after `FROM artifacts`) with their text, token ids and embedding (a list
    of floats, or None) opened by a fresh
    keyring over the run's key store (LETHE_KEY_DIR, tests/conftest.py): what the database holds, read as the service
    reads it (a row from before migration 0017 as its plaintext; a row whose leaf was shredded with `erased` set)."""
    import os
    from pathlib import Path

    import numpy as np

    from app.keys.errors import Erased
    from app.keys.keyring import Keyring
    from app.keys.local import LocalProvider
    from app.sessions.repositories.sealing import binding

    keyring = Keyring(LocalProvider(Path(os.environ["LETHE_KEY_DIR"])), ttl_s=60.0)

    async def run() -> list[dict[str, Any]]:
        conn = await asyncpg.connect(database_url)
        try:
            rows = [dict(r) for r in await conn.fetch(f"SELECT * FROM artifacts {where}", *args)]
        finally:
            await conn.close()
        for row in rows:
            row["erased"] = False
            if row["leaf"] is None:
                row["embedding"] = None if row["embedding"] is None else [float(x) for x in row["embedding"]]
                continue
            tenant_id, artifact_id = row["tenant_id"], row["id"]
            try:
                text = await keyring.unseal(binding(tenant_id, artifact_id, "content"), row["content_sealed"])
                tokens = await keyring.unseal(binding(tenant_id, artifact_id, "token_ids"), row["token_ids_sealed"])
            except Erased:
                row["erased"] = True
                continue
            row["content"], row["token_ids"] = text.decode(), np.frombuffer(tokens, dtype="<i4").tolist()
            if row["embedding_sealed"] is not None:
                vector = await keyring.unseal(binding(tenant_id, artifact_id, "embedding"), row["embedding_sealed"])
                row["embedding"] = np.frombuffer(vector, dtype="<f4").tolist()
        return rows

    return asyncio.run(run())


def files_holding(root: Path, needles: list[bytes]) -> dict[bytes, list[str]]:
    """Every file under `root` (heap files, WAL segments, anything) whose bytes contain each needle: what an
    operator's `grep -a` over a data directory finds."""
    found: dict[bytes, list[str]] = {needle: [] for needle in needles}
    for path in sorted(root.rglob("*")):
        try:
            if not path.is_file():
                continue
            data = path.read_bytes()
        except (FileNotFoundError, PermissionError):  # a temporary file PostgreSQL removed meanwhile
            continue
        for needle in needles:
            if needle in data:
                found[needle].append(str(path.relative_to(root)))
    return found


def stored_environments(database_url: str, session_id: str) -> list[dict[str, Any]]:
    """A session's rows of `env_snapshots`, ordered by turn, with `state` opened by a fresh keyring over the run's
    key store (a row from before migration 0021 as its plaintext JSON; None when its leaf was shredded)."""
    import json
    import os
    from pathlib import Path

    from app.keys.errors import Erased
    from app.keys.keyring import Keyring
    from app.keys.local import LocalProvider
    from app.sessions.repositories.settings_sealing import state_binding

    keyring = Keyring(LocalProvider(Path(os.environ["LETHE_KEY_DIR"])), ttl_s=60.0)

    async def run() -> list[dict[str, Any]]:
        conn = await asyncpg.connect(database_url)
        try:
            rows = [dict(r) for r in await conn.fetch(
                "SELECT * FROM env_snapshots WHERE session_id = $1 ORDER BY turn", session_id)]
        finally:
            await conn.close()
        for row in rows:
            if row["state_sealed"] is None:
                row["state"] = None if row["state"] is None else json.loads(row["state"])
                continue
            try:
                row["state"] = json.loads(await keyring.unseal(state_binding(row["tenant_id"], row["id"]),
                                                               row["state_sealed"]))
            except Erased:
                row["state"] = None
        return rows

    return asyncio.run(run())


def new_tenant_key(database_url: str, prefix: str) -> str:
    """An API key of a new tenant (named `prefix-<random>`) on the database, made as `lethe tenant create` makes
    one."""
    from app.db.database import Database
    from app.tenants.service import TenantService

    async def create() -> str:
        db = Database(database_url, pool_size=1)
        try:
            _, key = await TenantService(db).create_tenant(f"{prefix}-{uuid.uuid4().hex[:8]}")
        finally:
            await db.close()
        return key

    return asyncio.run(create())


@asynccontextmanager
async def rolled_back(database_url: str, *, drop_index: str | None = None) -> AsyncIterator[asyncpg.Connection]:
    """A connection in a transaction that is rolled back at the end, with `drop_index` dropped inside it (what a plan
    would be without that index; nobody else ever sees it gone)."""
    conn = await asyncpg.connect(database_url)
    try:
        transaction = conn.transaction()
        await transaction.start()
        try:
            await conn.execute("SET LOCAL lock_timeout = '10s'")
            if drop_index is not None:
                await conn.execute(f"DROP INDEX {drop_index}")
            yield conn
        finally:
            await transaction.rollback()
    finally:
        await conn.close()


async def custom_and_generic_plans(conn: asyncpg.Connection, statement: Any, params: dict[str, Any], name: str
                                   ) -> tuple[Any, Any]:
    """EXPLAIN (FORMAT JSON) of a repository `Statement` with `params`: the custom plan PostgreSQL makes for these
    values, and the generic plan a prepared statement (asyncpg prepares every one) falls back to. Run inside a
    transaction: the prepared statement `name` and the plan-cache setting end with it."""
    args = statement.args(params)
    custom = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {statement.dollar}", *args)
    await conn.execute(f"PREPARE {name} AS {statement.dollar}")
    await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
    literals = [await conn.fetchval("SELECT quote_nullable($1::text)", None if a is None else str(a))
                for a in args]  # EXPLAIN EXECUTE takes no parameters of its own
    generic = await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE {name}({', '.join(literals)})")
    await conn.execute("SET LOCAL plan_cache_mode = auto")
    return json.loads(custom)[0]["Plan"], json.loads(generic)[0]["Plan"]
