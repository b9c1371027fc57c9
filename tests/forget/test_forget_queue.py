"""The forget queue's plumbing, on a database of its own (the suite's server would claim jobs queued in the shared
one): status events over LISTEN/NOTIFY wake waiters and every process's worker at once; a job sent back waits in the
queue, not in the worker that tried it; the lease heartbeat survives a failed renewal; a failed job is logged with
its traceback. The executor is a stub: these tests are about the queue, not about forgetting."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from sqlalchemy import text

from app.db.database import Database
from app.db.embedded import start_embedded_postgres
from app.db.migrate import upgrade_to_head_async
from app.db.notifications import JobEvents
from app.forget.jobs import Retry
from app.forget.repositories import jobs as jobs_repo
from app.forget.worker import ForgetWorker
from app.ids import new_id
from app.keys.content import Sealer
from app.keys.keyring import Keyring
from app.keys.leaves import Leaves
from app.keys.local import LocalProvider
from app.observability.metrics import Metrics
from app.tenants.service import TenantService
from bench.serve import stop_postgres

ASYNC = pytest.mark.asyncio(loop_scope="session")
BOUND_S = 120  # bounds a bug, never paces the test


@pytest.fixture(scope="module")
def private_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir = tmp_path_factory.mktemp("queue-db")
    try:
        yield start_embedded_postgres(data_dir)
    finally:
        stop_postgres(data_dir / "pg")


@pytest.fixture(scope="module")
def key_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("queue-keys")


@pytest.fixture
def sealer(db: Database, key_dir: Path) -> Sealer:
    """The process's sealer, as the services hand it to the repositories (these jobs hold nothing to seal)."""
    return Sealer(Keyring(LocalProvider(key_dir)), Leaves(TenantService(db).reserve_leaves))


@pytest_asyncio.fixture(loop_scope="session")
async def db(private_url: str) -> AsyncIterator[Database]:
    await upgrade_to_head_async(private_url)
    database = Database(private_url, pool_size=2)
    async with database.transaction() as tx:
        await tx.execute(text(
            "INSERT INTO tenants (id, name) VALUES ('ten_queue', 'queue') ON CONFLICT DO NOTHING"
        ))
    yield database
    await database.close()


async def _queued(db: Database, sealer: Sealer, priority: int = 1) -> str:
    async with db.transaction() as tx:
        job = await jobs_repo.create(
            tx, sealer, id=new_id("fgt"), tenant_id="ten_queue", status="queued", strategy="no_forget",
            target={"session_id": "ses_x"}, reason=None, receipt={}, attempts=0, priority=priority,
        )
    return job.id


@ASYNC
async def test_a_status_change_from_any_connection_wakes_its_waiter_and_the_workers(
    db: Database, sealer: Sealer
) -> None:
    queued = asyncio.Event()
    events = JobEvents(db.pg_url, queued)
    listening = asyncio.create_task(events.run())
    try:
        await asyncio.wait_for(events.listening.wait(), BOUND_S)
        queued.clear()
        job_id = await _queued(db, sealer)  # as another process would queue it
        await asyncio.wait_for(queued.wait(), BOUND_S)
        with events.watch(job_id) as changed:
            other = await asyncpg.connect(db.pg_url)
            try:
                await other.execute("UPDATE forget_jobs SET status = 'succeeded' WHERE id = $1", job_id)
            finally:
                await other.close()
            await asyncio.wait_for(changed.wait(), BOUND_S)
    finally:
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)


class _Stub:
    """An executor that sends back the jobs it is told to and records the order it ran jobs in."""

    def __init__(self, busy: set[str]) -> None:
        self.busy, self.ran = busy, []

    async def execute(self, job: Any, owner: str) -> None:
        self.ran.append(job.id)
        if job.id in self.busy:
            raise Retry("its session is busy")


@ASYNC
async def test_a_job_sent_back_waits_in_the_queue_while_the_worker_runs_the_next(db: Database, sealer: Sealer) -> None:
    first, second = await _queued(db, sealer), await _queued(db, sealer)
    stub = _Stub({first})
    worker = ForgetWorker(db, Metrics(), stub, lease_s=30, poll_s=60)  # type: ignore[arg-type]
    assert await worker.step() and await worker.step()  # no pause between them
    assert stub.ran == [first, second]
    async with db.transaction() as tx:
        sent_back = await jobs_repo.get(tx, sealer, "ten_queue", first)
    assert sent_back is not None and sent_back.status == "queued" and sent_back.run_after is not None
    assert not await worker.step()  # not claimable before its time: nothing else to run
    async with db.transaction() as tx:  # cleanup: nobody else may claim it
        await tx.execute(text("DELETE FROM forget_jobs WHERE tenant_id = 'ten_queue'"))


@ASYNC
async def test_a_failing_retention_sweep_does_not_hold_up_the_forget_jobs(db: Database, sealer: Sealer) -> None:
    async with db.transaction() as tx:
        await tx.execute(text("DELETE FROM forget_jobs WHERE tenant_id = 'ten_queue'"))
    job = await _queued(db, sealer)
    stub, sweeps = _Stub(set()), []

    async def failing(owner: str) -> str | None:
        sweeps.append(owner)
        raise RuntimeError("the sweep broke")

    worker = ForgetWorker(db, Metrics(), stub, lease_s=30, poll_s=60, retention=failing)  # type: ignore[arg-type]
    assert await worker.step()
    assert stub.ran == [job] and sweeps == [worker.owner]
    async with db.transaction() as tx:
        await tx.execute(text("DELETE FROM forget_jobs WHERE tenant_id = 'ten_queue'"))


@ASYNC
async def test_a_detector_s_job_is_claimed_before_older_forgets(db: Database, sealer: Sealer) -> None:
    async with db.transaction() as tx:
        await tx.execute(text("DELETE FROM forget_jobs WHERE tenant_id = 'ten_queue'"))
    older, plain = await _queued(db, sealer), await _queued(db, sealer)
    detector = await _queued(db, sealer, priority=2)  # a detector webhook's (app/engine/priority.py DETECTOR)
    claimed = []
    for _ in range(3):
        async with db.transaction() as tx:
            job = await jobs_repo.claim(tx, "test-worker", 30)
        assert job is not None
        claimed.append(job.id)
    assert claimed == [detector, older, plain]
    async with db.transaction() as tx:
        await tx.execute(text("DELETE FROM forget_jobs WHERE tenant_id = 'ten_queue'"))


@ASYNC
async def test_the_lease_heartbeat_survives_a_failed_renewal(
    db: Database, sealer: Sealer, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    third = asyncio.Event()
    renew = jobs_repo.renew

    async def flaky(tx: Any, job_id: str, owner: str, lease_s: float) -> bool:
        calls.append(job_id)
        if len(calls) == 1:
            raise ConnectionResetError("the database blinked")
        if len(calls) >= 3:
            third.set()
        return await renew(tx, job_id, owner, lease_s)

    monkeypatch.setattr(jobs_repo, "renew", flaky)
    job_id = await _queued(db, sealer)
    worker = ForgetWorker(db, Metrics(), _Stub(set()), lease_s=0.3, poll_s=60)  # type: ignore[arg-type]
    async with db.transaction() as tx:
        claimed = await jobs_repo.claim(tx, worker.owner, 30)
    assert claimed is not None and claimed.id == job_id
    beating = asyncio.create_task(worker._heartbeat(job_id))
    try:
        await asyncio.wait_for(third.wait(), BOUND_S)
        assert not beating.done()  # still renewing after the failure
    finally:
        beating.cancel()
        await asyncio.gather(beating, return_exceptions=True)


def test_a_failed_job_is_logged_with_its_traceback(
    client: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.forget import strategies

    async def boom(self: object, work: object, policy: object) -> None:
        raise RuntimeError("the replay hit a wall")

    sid = client.post("/v1/sessions", json={"system_prompt": "Hi."}).json()["id"]
    monkeypatch.setattr(strategies.NoForget, "apply", boom)
    with caplog.at_level(logging.WARNING):
        job = client.post("/v1/forget", json={
            "target": {"session_id": sid, "text": "Hi"}, "strategy": "no_forget", "wait": True,
        }).json()
    assert job["status"] == "failed" and "the replay hit a wall" in job["error"]
    [record] = [r for r in caplog.records if r.getMessage() == "forget job failed"]
    assert record.exc_info is not None and "boom" in str(record.exc_text or logging.Formatter().formatException(
        record.exc_info))
