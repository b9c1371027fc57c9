"""Retention (issue 43; docs/subjects.md, "Retention"): per-tenant limits, a subject's and a namespace's override,
a sweep every process's forget worker runs under a lease, erasing through the same machinery as every erasure,
skipping what a legal hold covers (and saying so on the hold), with one `retention` receipt.

The sweep's clock is moved forward (`RetentionService.clock`), never slept on and no row back-dated. Each test runs in
a tenant of its own, so a month-long jump erases nothing of any other test's.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from app.db.database import Database
from app.db.statements import OnConnection
from app.retention import repository as repo
from app.tenants.service import TenantService
from tests.support import problem, sql, until


@contextmanager
def _tenant_client(live_server: Any, database_url: str) -> Iterator[httpx.Client]:
    """A client of a tenant made for it alone."""
    async def create() -> str:
        db = Database(database_url, pool_size=1)
        try:
            return (await TenantService(db).create_tenant("retention-" + uuid.uuid4().hex[:8]))[1]
        finally:
            await db.close()

    key = asyncio.run(create())
    with httpx.Client(base_url=live_server.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=300) as c:
        yield c


@pytest.fixture
def tenant(live_server: Any, database_url: str) -> Iterator[httpx.Client]:
    with _tenant_client(live_server, database_url) as c:
        yield c


@contextmanager
def _a_month_later(live_server: Any) -> Iterator[None]:
    """The sweep's clock 31 days ahead while inside, then back."""
    service = live_server.app.state.container.services.retention
    real = service.clock
    service.clock = lambda: datetime.now(UTC) + timedelta(days=31)
    try:
        yield
    finally:
        service.clock = real


@pytest.fixture
def month_later(live_server: Any) -> Iterator[None]:
    """The sweep's clock 31 days ahead for this test, then back."""
    with _a_month_later(live_server):
        yield


def _swept(client: httpx.Client, after: str | None) -> dict[str, Any]:
    """Until a sweep newer than `after` recorded its receipt; that receipt."""
    def done() -> bool:
        last = client.get("/v1/retention").json()["last_sweep_forget_id"]
        return last is not None and last != after

    until(done, "a retention sweep recorded its receipt")
    job: dict[str, Any] = client.get(f"/v1/forget/{client.get('/v1/retention').json()['last_sweep_forget_id']}").json()
    return job


def _put_memory(client: httpx.Client, ns: str, key: str) -> None:
    r = client.put(f"/v1/memory/{ns}/{key}", json={"value": {"n": 1}, "source": "user"},
                   headers={"If-None-Match": "*"})
    assert r.status_code == 201, r.text


@pytest.mark.usefixtures("month_later")
def test_a_sweep_erases_what_expired_keeps_overrides_and_holds_and_the_release_lets_it_go(
    tenant: httpx.Client, live_server: Any,
) -> None:
    expired = tenant.post("/v1/sessions", json={}).json()["id"]
    held = tenant.post("/v1/sessions", json={}).json()["id"]
    kept = tenant.post("/v1/sessions", json={"subject_id": "keeper"}).json()["id"]
    _put_memory(tenant, "notes", "old")
    _put_memory(tenant, "case", "evidence")
    hold = tenant.post("/v1/holds", json={"session_id": held, "reason": "case 7"}).json()
    assert tenant.post("/v1/holds", json={"namespace": "case", "reason": "case 7"}).status_code == 201

    assert tenant.put("/v1/retention/subjects/keeper", json={"sessions_max_idle_days": 365}).status_code == 200
    policy = tenant.put("/v1/retention", json={"sessions_max_idle_days": 30, "memory_max_age_days": 30})
    assert policy.status_code == 200, policy.text
    assert policy.json()["subjects"][0]["subject_id"] == "keeper" and policy.json()["next_sweep_at"] is not None

    job = _swept(tenant, None)
    assert job["strategy"] == "retention" and job["status"] == "succeeded"
    receipt = job["retention"]
    assert receipt["sessions"] == [expired] and receipt["memory_keys"] == 1
    assert {"hold_id": hold["id"], "session_id": held} in receipt["held"]
    assert any(h.get("namespace") == "case" and h.get("key") == "evidence" for h in receipt["held"])
    assert job["erasure"] is not None
    problem(tenant.get(f"/v1/sessions/{expired}"), 404)
    assert tenant.get(f"/v1/sessions/{kept}").status_code == 200  # the subject's override: a year
    assert tenant.get(f"/v1/sessions/{held}").status_code == 200
    gone = tenant.get("/v1/memory/notes/old")
    assert gone.status_code == 404 and gone.json()["forgotten"] is True
    assert tenant.get("/v1/memory/case/evidence").status_code == 200
    trail = tenant.get(f"/v1/holds/{hold['id']}").json()["events"]
    assert trail[-1]["action"] == "skipped" and trail[-1]["detail"] == {"forget_id": job["id"], "session_id": held}

    # Released: retention takes it at the next sweep (a policy change makes one due now).
    assert tenant.delete(f"/v1/holds/{hold['id']}").status_code == 200
    policy = {"sessions_max_idle_days": 30, "memory_max_age_days": 30}
    assert tenant.put("/v1/retention", json=policy).status_code == 200
    again = _swept(tenant, job["id"])
    assert again["retention"]["sessions"] == [held]
    problem(tenant.get(f"/v1/sessions/{held}"), 404)
    assert tenant.get(f"/v1/sessions/{kept}").status_code == 200

    metrics = httpx.get(f"{live_server.base_url}/metrics").text
    assert 'lethe_erasures_total{kind="session",reason="retention"}' in metrics
    assert 'lethe_erasures_held_total{reason="retention"}' in metrics


def test_without_a_limit_nothing_expires(tenant: httpx.Client) -> None:
    session = tenant.post("/v1/sessions", json={}).json()["id"]
    before = tenant.get("/v1/retention").json()
    assert before["sessions_max_idle_days"] is None and before["next_sweep_at"] is None
    after = tenant.put("/v1/retention", json={"sessions_max_idle_days": None, "memory_max_age_days": 30}).json()
    assert after["sessions_max_idle_days"] is None and after["memory_max_age_days"] == 30
    assert tenant.get(f"/v1/sessions/{session}").status_code == 200


def test_bad_input_answers_422(tenant: httpx.Client) -> None:
    for body in ({"sessions_max_idle_days": 0}, {"sessions_max_idle_days": 36_501}, {"memory_max_age_days": "30"},
                 {"memory_max_age_days": 1.5}, {"keep": 1}):
        problem(tenant.put("/v1/retention", json=body), 422)
    for bad in ("-dash", "has space", "x" * 201):
        problem(tenant.put(f"/v1/retention/subjects/{bad}", json={}), 422)
    assert tenant.get("/v1/retention").json()["next_sweep_at"] is None  # nothing above set a policy


def test_one_process_sweeps_a_tenant_at_a_time(database_url: str, tenant: httpx.Client) -> None:
    """The lease, on the real database: a due sweep leased to one worker is not claimed by another until it is done
    or its lease lapsed (a worker that died). The tenant's sweep is put a day out, past the server's own worker (on
    the real clock); the claims here run on a clock two days ahead."""
    tenant.put("/v1/retention", json={"memory_max_age_days": 30})
    [mine] = sql(database_url, "SELECT tenant_id FROM retention_sweeps ORDER BY next_at DESC LIMIT 1")
    owner = mine["tenant_id"]
    sql(database_url, "UPDATE retention_sweeps SET next_at = now() + interval '1 day' WHERE tenant_id = $1", owner)
    others = {r["tenant_id"]: r["next_at"] for r in sql(
        database_url, "SELECT tenant_id, next_at FROM retention_sweeps WHERE tenant_id <> $1", owner)}
    ahead = datetime.now(UTC) + timedelta(days=2)

    async def scenario() -> list[str | None]:
        db = Database(database_url, pool_size=2)
        seen: list[str | None] = []
        try:
            async with db.pg() as on:
                assert isinstance(on, OnConnection)
                # Other test tenants' due sweeps come first (oldest due): held aside, put back as they were below.
                aside = []
                while (claimed := await repo.claim(on, "test-a", ahead, 600)) in others:
                    aside.append(claimed)
                seen.append(claimed)
                seen.append(await repo.claim(on, "test-b", ahead, 600))  # leased to test-a: nothing for b
                await on.connection.execute(
                    "UPDATE retention_sweeps SET lease_expires_at = now() - interval '1 second' WHERE tenant_id = $1",
                    owner)
                seen.append(await repo.claim(on, "test-b", ahead, 600))  # a lapsed lease: b takes it over
                await repo.done(on, owner, "test-b", datetime.now(UTC) + timedelta(days=1), None)
                for other in aside:
                    await repo.done(on, other, "test-a", others[other], None)
        finally:
            await db.close()
        return seen

    assert asyncio.run(scenario()) == [owner, None, owner]


# -- a namespace's own override (its keys: the namespace's limit, else its subjects', else the tenant's) -------------

def _set_up_then_sweep_a_month_later(client: httpx.Client, live_server: Any, default: dict[str, Any]) -> dict[str, Any]:
    """The policies were set on the real clock (nothing is a month old yet: a sweep they made due finds nothing and
    records nothing); the clock moves a month ahead and the tenant's default, put again, makes a sweep due now. Any
    sweep on the moved clock sees every policy, so the one receipt it records is this sweep's."""
    with _a_month_later(live_server):
        assert client.put("/v1/retention", json=default).status_code == 200
        return _swept(client, None)


def _forgotten(client: httpx.Client, ns: str) -> bool:
    read = client.get(f"/v1/memory/{ns}/k")
    assert read.status_code in (200, 404), read.text
    return read.status_code == 404 and read.json()["forgotten"] is True


def test_a_namespace_override_shortens_its_keys_life_and_beats_its_subjects(
    tenant: httpx.Client, live_server: Any,
) -> None:
    for ns in ("short", "plain", "mine-long", "mine-short", "deferring"):
        _put_memory(tenant, ns, "k")
    # Subjects: a month's override linked to a namespace with a year of its own, and the other way round.
    assert tenant.put("/v1/subjects/cust-month", json={"memory_namespaces": ["mine-long", "deferring"]}).status_code \
        == 201
    assert tenant.put("/v1/subjects/cust-year", json={"memory_namespaces": ["mine-short"]}).status_code == 201
    assert tenant.put("/v1/retention/subjects/cust-month", json={"memory_max_age_days": 30}).status_code == 200
    assert tenant.put("/v1/retention/subjects/cust-year", json={"memory_max_age_days": 365}).status_code == 200
    for ns, days in (("short", 30), ("mine-long", 365), ("mine-short", 30), ("deferring", None)):
        put = tenant.put(f"/v1/retention/namespaces/{ns}", json={"memory_max_age_days": days})
        assert put.status_code == 200, put.text
    default = {"sessions_max_idle_days": None, "memory_max_age_days": 45}  # a month and a day: nothing by default
    assert tenant.put("/v1/retention", json=default).status_code == 200

    listed = tenant.get("/v1/retention").json()
    assert [(n["namespace"], n["memory_max_age_days"]) for n in listed["namespaces"]] == [
        ("deferring", None), ("mine-long", 365), ("mine-short", 30), ("short", 30)]
    assert all(n["updated_at"] for n in listed["namespaces"])
    assert [s["subject_id"] for s in listed["subjects"]] == ["cust-month", "cust-year"]

    job = _set_up_then_sweep_a_month_later(tenant, live_server, default)
    assert job["strategy"] == "retention" and job["status"] == "succeeded"
    assert job["retention"]["memory_keys"] == 3 and job["retention"]["held"] == []
    assert _forgotten(tenant, "short")  # its own month, shorter than the tenant's 45 days
    assert not _forgotten(tenant, "plain")  # as old, under the tenant's 45 days
    assert not _forgotten(tenant, "mine-long")  # its own year beats its subject's month
    assert _forgotten(tenant, "mine-short")  # its own month beats its subject's year
    assert _forgotten(tenant, "deferring")  # null defers: to its subject's month


def test_a_longer_namespace_override_keeps_what_the_default_expires_and_a_hold_still_keeps_its_namespace(
    tenant: httpx.Client, live_server: Any,
) -> None:
    for ns in ("long", "plain", "held"):
        _put_memory(tenant, ns, "k")
    assert tenant.put("/v1/retention/namespaces/long", json={"memory_max_age_days": 365}).status_code == 200
    assert tenant.put("/v1/retention/namespaces/held", json={"memory_max_age_days": 30}).status_code == 200
    hold = tenant.post("/v1/holds", json={"namespace": "held", "reason": "case 9"}).json()
    default = {"memory_max_age_days": 30}
    assert tenant.put("/v1/retention", json=default).status_code == 200

    job = _set_up_then_sweep_a_month_later(tenant, live_server, default)
    assert job["retention"]["memory_keys"] == 1
    assert job["retention"]["held"] == [{"hold_id": hold["id"], "namespace": "held", "key": "k"}]
    assert _forgotten(tenant, "plain")
    assert not _forgotten(tenant, "long")
    assert not _forgotten(tenant, "held")
    trail = tenant.get(f"/v1/holds/{hold['id']}").json()["events"]
    assert trail[-1]["action"] == "skipped"
    assert trail[-1]["detail"] == {"forget_id": job["id"], "namespace": "held", "key": "k"}


def test_a_namespace_override_refuses_bad_input_with_422(tenant: httpx.Client) -> None:
    for bad in ("a:b", "x" * 201, "a%01b", "a%00b", "a%7Fb"):
        problem(tenant.put(f"/v1/retention/namespaces/{bad}", json={"memory_max_age_days": 30}), 422)
    for body in ({"sessions_max_idle_days": 7}, {"memory_max_age_days": 0}, {"memory_max_age_days": 36_501},
                 {"memory_max_age_days": "30"}, {"memory_max_age_days": 1.5}, {"keep": 1}):
        problem(tenant.put("/v1/retention/namespaces/notes", json=body), 422)
    after = tenant.get("/v1/retention").json()
    assert after["namespaces"] == [] and after["next_sweep_at"] is None  # nothing above set a policy


def test_another_tenant_neither_sees_nor_shares_a_namespace_override(
    tenant: httpx.Client, live_server: Any, database_url: str,
) -> None:
    assert tenant.put("/v1/retention/namespaces/notes", json={"memory_max_age_days": 7}).status_code == 200
    with _tenant_client(live_server, database_url) as other:
        assert other.get("/v1/retention").json()["namespaces"] == []
        theirs = other.put("/v1/retention/namespaces/notes", json={"memory_max_age_days": 90}).json()
        assert [(n["namespace"], n["memory_max_age_days"]) for n in theirs["namespaces"]] == [("notes", 90)]
    mine = tenant.get("/v1/retention").json()["namespaces"]
    assert [(n["namespace"], n["memory_max_age_days"]) for n in mine] == [("notes", 7)]
