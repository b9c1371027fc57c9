"""Forget job events over PostgreSQL's LISTEN/NOTIFY: one listening connection per process.

A trigger announces every change of a job's status on `lethe_forget_jobs` (migration 0010), whichever process made
it. Here, a waiter (`POST /v1/forget` with `wait`) is woken the moment its job changes, and the process's forget
worker the moment any job is queued, in every process on the database: no polling loop does either. The connection
is kept open (opened again after the database restarts); while it is down, waiters and workers fall back to their
slow polls, so a lost notification delays, never loses, work.

The same channel carries shreds (`announce_shred`: `shred <tenant> <leaf>,<leaf>,...`): a process that punctured
leaves in the key provider tells the others to drop them from their key caches at once. One they miss is dropped
within the caches' time to live (half the erasure horizon, app/keys/factory.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Iterator

import asyncpg

from app.db.database import APPLICATION_NAME, Database
from app.db.statements import Statement

log = logging.getLogger(__name__)

CHANNEL = "lethe_forget_jobs"
_RECONNECT_S = 1.0
_SHRED = "shred"
_LEAVES_PER_NOTICE = 400  # a payload stays far below PostgreSQL's 8,000 bytes
_NOTIFY = Statement("SELECT pg_notify(:channel, :payload)")

Shredded = Callable[[str, list[int]], None]  # (tenant, leaves) another process (or this one) shredded


async def announce_shred(db: Database, tenant_id: str, leaves: list[int]) -> None:
    """Tell every process listening on the database that `leaves` of `tenant_id` are punctured."""
    async with db.pg() as sql:
        for i in range(0, len(leaves), _LEAVES_PER_NOTICE):
            chunk = ",".join(map(str, leaves[i : i + _LEAVES_PER_NOTICE]))
            await sql.one(_NOTIFY, {"channel": CHANNEL, "payload": f"{_SHRED} {tenant_id} {chunk}"})


def _nothing(_tenant_id: str, _leaves: list[int]) -> None:
    return None


class JobEvents:
    def __init__(self, url: str, queued: asyncio.Event, *, shredded: Shredded = _nothing) -> None:
        self.url = url
        self.queued = queued  # set when a job is queued anywhere: this process's forget worker waits on it
        self.shredded = shredded  # called with every shred announced (the process's keyring drops the leaves)
        self.listening = asyncio.Event()  # set while the connection listens (tests wait for it)
        self._watchers: dict[str, set[asyncio.Event]] = {}

    @contextlib.contextmanager
    def watch(self, job_id: str) -> Iterator[asyncio.Event]:
        """An event set whenever job `job_id` changes status, while the block runs."""
        event = asyncio.Event()
        self._watchers.setdefault(job_id, set()).add(event)
        try:
            yield event
        finally:
            watchers = self._watchers.get(job_id)
            if watchers is not None:
                watchers.discard(event)
                if not watchers:
                    del self._watchers[job_id]

    async def run(self) -> None:
        """Listen until cancelled, reconnecting after a lost connection."""
        while True:
            try:
                connection = await asyncpg.connect(self.url, server_settings={"application_name": APPLICATION_NAME})
            except (OSError, asyncpg.PostgresError) as exc:
                log.warning("job events: cannot connect; retrying", extra={"error": type(exc).__name__})
                await asyncio.sleep(_RECONNECT_S)
                continue
            lost = asyncio.Event()
            connection.add_termination_listener(functools.partial(_set, lost))
            try:
                await connection.add_listener(CHANNEL, self._notified)
                self.listening.set()
                self.queued.set()  # anything queued while nobody listened is claimable now
                await lost.wait()
                log.warning("job events: connection lost; reconnecting")
            except (OSError, asyncpg.PostgresError) as exc:
                log.warning("job events: listening failed; retrying", extra={"error": type(exc).__name__})
            finally:
                self.listening.clear()
                with contextlib.suppress(Exception):
                    await asyncio.shield(connection.close(timeout=2))
            await asyncio.sleep(_RECONNECT_S)

    def _notified(self, _connection: object, _pid: int, _channel: str, payload: str) -> None:
        job_id, _, status = payload.partition(" ")
        if job_id == _SHRED:
            tenant_id, _, leaves = status.partition(" ")
            self.shredded(tenant_id, [int(leaf) for leaf in leaves.split(",") if leaf])
            return
        for event in self._watchers.get(job_id, ()):
            event.set()
        if status == "queued":
            self.queued.set()


def _set(event: asyncio.Event, _connection: object) -> None:
    event.set()
