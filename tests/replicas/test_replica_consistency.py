"""Read-your-forgets across a real streaming replica: a read that carries a write's Lethe-Consistency token never shows
what that write forgot, whichever server answers; a read without one may see the replica's stale rows (and, with the
replica's replay paused, does: proof that reads really go to the replica, so the tokened reads' answers mean
something). A forgotten memory value is not among what a stale read can show: its key was shredded before the forget
answered, so the replica's stale row reads as forgotten at its stale version (docs/erasure-at-rest.md).

One primary and one replica (tests/replicas/conftest.py) under one real `lethe serve` (the real model, for the
session tests), in strict-forget mode (`LETHE_FORGET_REMOTE_APPLY`), which changes nothing until the primary names a
synchronous standby (test_strict_forgets_return_once_the_replica_applied_them does, for its own duration). Lag is
forced with `pg_wal_replay_pause()`, never waited for.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from lethe_client import AsyncLetheClient, Forgotten, LetheClient

from app.db.consistency import ConsistencyToken
from bench.replication import ReplicaPair, query
from bench.serve import LetheServer
from tests.replicas.replica_helpers import HEADER, client_of, lethe_on, reads, served, wait_metric
from tests.support import BOOTSTRAP_KEY, POLL_S, problem

WAIT_MS = 400  # LETHE_REPLICA_WAIT_MS: how long a tokened read waits for the paused replica before the primary


@pytest.fixture(scope="module")
def server(pair: ReplicaPair) -> Iterator[LetheServer]:
    with lethe_on(pair, LETHE_REPLICA_WAIT_MS=str(WAIT_MS), LETHE_FORGET_REMOTE_APPLY="true") as lethe:
        yield lethe


@pytest.fixture
def http(server: LetheServer) -> Iterator[httpx.Client]:
    with client_of(server) as c:
        yield c


@pytest.fixture
def ns() -> str:
    return "r-" + uuid.uuid4().hex[:10]


def _token(response: httpx.Response) -> str:
    token = response.headers.get(HEADER)
    assert token, f"{response.request.method} {response.request.url.path} answered without {HEADER}"
    ConsistencyToken.parse(token)
    return token


def _create(http: httpx.Client, ns: str, key: str, value: object) -> str:
    r = http.put(f"/v1/memory/{ns}/{key}", json={"value": value, "source": "user"}, headers={"If-None-Match": "*"})
    assert r.status_code == 201, r.text
    return _token(r)


def test_untokened_reads_see_the_lagging_replica_tokened_reads_never_do(
    pair: ReplicaPair, server: LetheServer, http: httpx.Client, ns: str
) -> None:
    path = f"/v1/memory/{ns}/allergy"
    written = _create(http, ns, "allergy", "peanut")
    pair.wait_caught_up()
    pair.pause_replay()
    before = reads(server.url)

    forgot = http.delete(path)
    assert forgot.status_code == 200
    token = _token(forgot)
    assert ConsistencyToken.parse(token).lsn > ConsistencyToken.parse(written).lsn
    tombstone = forgot.json()["version"]

    # No token: eventually consistent, and the replica has not replayed the forget: it still has the live row at
    # version 1. Its value's key was shredded before the DELETE answered, though (erasure at rest reaches every copy
    # at once), so the stale row reads as forgotten, at its stale version, never as the value.
    stale = http.get(path)
    assert problem(stale, 404)["forgotten"] is True and stale.json()["version"] == 1
    older = http.get(path, headers={HEADER: written})  # a token from before the forget: the replica satisfies it
    assert problem(older, 404)["forgotten"] is True and older.json()["version"] == 1
    assert served(server.url, before) == {("replica", "untokened"): 1, ("replica", "token"): 1}

    started = time.monotonic()
    fresh = http.get(path, headers={HEADER: token})
    elapsed = time.monotonic() - started
    body = problem(fresh, 404)
    assert body["forgotten"] is True and body["version"] == tombstone  # never stale, never an error
    # It waited its bound for the replica, then read the primary: the server counts a read as the primary's for
    # `lagging` only once its wait for the replica's replay ran out (checked with `served` below), and the answer
    # came no sooner than that bound. A lower bound only: a timer never fires early and load only makes a request
    # slower, so this fails only when the read did not wait. How much longer it took is not asserted.
    assert elapsed >= WAIT_MS / 1000, f"answered {elapsed:.3f} s after the request: it did not wait for the replica"
    listed = http.get(f"/v1/memory/{ns}", headers={HEADER: token}).json()["keys"]
    history = http.get(f"{path}/history", headers={HEADER: token}).json()["versions"]
    assert listed == [] and [v["op"] for v in history] == ["write", "forget"] and history[0]["value"] is None
    assert http.get(f"/v1/memory/{ns}").json()["keys"] == []  # untokened, the replica's: its stale row is shredded
    assert served(server.url, before) == {
        ("replica", "untokened"): 2, ("replica", "token"): 1, ("primary", "lagging"): 3,
    }

    pair.resume_replay()
    pair.wait_caught_up()
    before = reads(server.url)
    assert problem(http.get(path, headers={HEADER: token}), 404)["forgotten"] is True
    assert served(server.url, before) == {("replica", "token"): 1}  # caught up: the replica serves it again


@pytest.mark.parametrize("bad", [
    "garbage", "v1:1:1:0/1", "v2" + "0" * 40, "v1" + "0" * 39, "v1" + "0" * 41, "v1" + "A" * 40,
])
def test_a_malformed_token_answers_422_after_authentication(
    server: LetheServer, http: httpx.Client, ns: str, bad: str
) -> None:
    _create(http, ns, "k", 1)
    for path in (f"/v1/memory/{ns}/k", f"/v1/memory/{ns}", f"/v1/memory/{ns}/k/history", "/v1/sessions",
                 "/v1/forget", "/v1/webhooks/deliveries"):
        body = problem(http.get(path, headers={HEADER: bad}), 422)
        assert HEADER in str(body), body
        problem(httpx.get(server.url + path, headers={HEADER: bad}, timeout=60), 401)


def test_a_token_of_another_timeline_or_cluster_reads_the_primary(
    server: LetheServer, http: httpx.Client, ns: str
) -> None:
    mine = ConsistencyToken.parse(_create(http, ns, "k", "v"))
    before = reads(server.url)
    for other in (
        ConsistencyToken(mine.system_id, mine.timeline + 1, 1),  # written after a failover this replica never saw
        ConsistencyToken(mine.system_id + 1, mine.timeline, 1),  # another cluster altogether
    ):
        r = http.get(f"/v1/memory/{ns}/k", headers={HEADER: other.encode()})
        assert r.status_code == 200 and r.json()["value"] == "v"
    assert served(server.url, before) == {("primary", "other_timeline"): 2}


def test_the_client_reads_its_own_forgets_with_no_code_from_the_user(
    pair: ReplicaPair, server: LetheServer, ns: str
) -> None:
    with LetheClient(server.url, BOOTSTRAP_KEY) as me, LetheClient(server.url, BOOTSTRAP_KEY) as stranger:
        me.put(ns, "diet", "vegan", if_none_match=True)
        me.put(ns, "city", "Paris", if_none_match=True)
        assert me.consistency is not None and stranger.consistency is None
        pair.wait_caught_up()
        pair.pause_replay()
        before = reads(server.url)
        me.forget(ns, "diet")
        with pytest.raises(Forgotten):
            me.get(ns, "diet")  # its newest token: never the replica that has not replayed the forget
        with pytest.raises(Forgotten) as stale:  # another client, no token: the replica that lags answers...
            stranger.get(ns, "diet")
        assert stale.value.version == 1  # ...its stale row, whose value's key the forget shredded already
        stranger.observe_consistency(me.consistency)  # handed the token, it reads the forget too
        with pytest.raises(Forgotten):
            stranger.get(ns, "diet")
        # Forget and supersede across replicas: the write lands (primary), and this client's reads see it at once.
        written = me.safe_forget_then_write(ns, "city", "Lyon")
        assert me.get(ns, "city").value == "Lyon" and me.get(ns, "city").version == written.version
        assert [e.op for e in me.history(ns, "city")] == ["write", "forget", "write"]
        assert me.list(ns).keys == ["city"]
        assert served(server.url, before)[("replica", "untokened")] == 1  # the stranger's stale read, nothing else


async def test_the_async_client_reads_its_own_forgets(pair: ReplicaPair, server: LetheServer, ns: str) -> None:
    async with AsyncLetheClient(server.url, BOOTSTRAP_KEY) as me, AsyncLetheClient(server.url, BOOTSTRAP_KEY) as other:
        await me.put(ns, "pin", "1234", if_none_match=True)
        await asyncio.to_thread(pair.wait_caught_up)
        await asyncio.to_thread(pair.pause_replay)
        await me.forget(ns, "pin")
        with pytest.raises(Forgotten):
            await me.get(ns, "pin")
        with pytest.raises(Forgotten) as stale:  # no token: the lagging replica's row, its key shredded already
            await other.get(ns, "pin")
        assert stale.value.version == 1
        written = await me.safe_forget_then_write(ns, "pin", "9876")
        assert (await me.get(ns, "pin")).version == written.version


def test_sessions_and_forget_jobs_read_their_forgets(
    pair: ReplicaPair, server: LetheServer, http: httpx.Client
) -> None:
    created = http.post("/v1/sessions", json={"system_prompt": "You are terse."})
    assert created.status_code == 201
    _token(created)
    sid = created.json()["id"]
    turn = http.post(f"/v1/sessions/{sid}/turns", json={
        "inputs": [{"type": "user", "content": "My IBAN is UK55LETH0001."},
                   {"type": "user", "content": "My PIN is 4321."}],
        "generate": False,
    })
    assert turn.status_code == 200
    _token(turn)
    iban, pin = (i["artifact_id"] for i in turn.json()["inputs"])
    pair.wait_caught_up()
    pair.pause_replay()

    queued = http.post("/v1/forget", json={"target": {"artifact_id": iban}})
    assert queued.status_code in (200, 202)
    assert (HEADER in queued.headers) == (queued.status_code == 200)  # a token only once the forget is durable
    with LetheClient(server.url, BOOTSTRAP_KEY) as lethe:
        job = lethe.wait_forget(queued.json()["id"], timeout_s=300, interval=0.2)
    assert job["status"] == "succeeded"
    polled = http.get(f"/v1/forget/{job['id']}")
    token = _token(polled)  # the finished job's answer: a token past the job's swap
    waited = http.post("/v1/forget", json={"target": {"artifact_id": pin}, "wait": True})
    assert waited.status_code == 200 and waited.json()["status"] == "succeeded"
    token = _token(waited)

    stale = http.get(f"/v1/sessions/{sid}/artifacts").json()["artifacts"]
    assert {iban, pin} <= {a["id"] for a in stale}  # untokened: the replica, which has replayed neither forget
    fresh = http.get(f"/v1/sessions/{sid}/artifacts", headers={HEADER: token}).json()["artifacts"]
    assert not {iban, pin} & {a["id"] for a in fresh}
    assert not any("UK55" in a["content"] or "4321" in a["content"] for a in fresh)
    assert http.get(f"/v1/sessions/{sid}", headers={HEADER: token}).json()["epoch"] == 2
    assert http.get(f"/v1/sessions/{sid}").json()["epoch"] == 0
    jobs = http.get("/v1/forget", params={"session_id": sid}, headers={HEADER: token}).json()["jobs"]
    assert {j["id"] for j in jobs} == {job["id"], waited.json()["id"]}
    assert http.get("/v1/forget", params={"session_id": sid}).json()["jobs"] == []  # not replayed yet
    descendants = http.get(f"/v1/sessions/{sid}/artifacts/{iban}/descendants", headers={HEADER: token})
    problem(descendants, 404)  # the forgotten artifact is gone for a tokened read
    assert http.get(f"/v1/sessions/{sid}/artifacts/{iban}/descendants").status_code == 200  # the stale replica
    assert http.get("/v1/webhooks/deliveries", headers={HEADER: token}).status_code == 200


def test_deleting_an_openai_conversation_item_answers_a_token(server: LetheServer, http: httpx.Client) -> None:
    conv = http.post("/v1/conversations", json={"items": [{"role": "user", "content": "My IBAN is UK77."}]})
    assert conv.status_code == 200, conv.text
    items = http.get(f"/v1/conversations/{conv.json()['id']}/items").json()["data"]
    item = next(i for i in items if "UK77" in str(i))
    path = f"/v1/conversations/{conv.json()['id']}/items/{item['id']}"
    planned = http.delete(path, params={"lethe_dry_run": "true"})
    assert planned.status_code == 200 and HEADER not in planned.headers  # a plan changes nothing
    deleted = http.delete(path)
    assert deleted.status_code == 200
    _token(deleted)


def test_strict_forgets_return_once_the_replica_applied_them(
    pair: ReplicaPair, server: LetheServer, http: httpx.Client, ns: str
) -> None:
    """With the replica named synchronous, a forget commits with synchronous_commit = remote_apply: it blocks while
    the replica does not replay (the cost), and once it returns, even an untokened read of the replica sees it."""
    admin = pair.primary.url
    path = f"/v1/memory/{ns}/secret"
    _create(http, ns, "secret", "s3cr3t")
    query(admin, "ALTER SYSTEM SET synchronous_standby_names = '*'")
    query(admin, "SELECT pg_reload_conf()")
    try:
        pair.wait_caught_up()
        pair.pause_replay()
        answer: list[httpx.Response] = []
        deleting = threading.Thread(target=lambda: answer.append(http.delete(path)))
        deleting.start()
        _wait_for_sync_rep(admin)  # the forget's commit is parked, waiting for the replica to apply it
        assert not answer and deleting.is_alive()
        pair.resume_replay()
        deleting.join(timeout=120)
        assert answer and answer[0].status_code == 200
        before = reads(server.url)
        assert problem(http.get(path), 404)["forgotten"] is True  # no token, and still never the forgotten value
        assert served(server.url, before) == {("replica", "untokened"): 1}
    finally:
        query(admin, "ALTER SYSTEM RESET synchronous_standby_names")
        query(admin, "SELECT pg_reload_conf()")


def _wait_for_sync_rep(url: str, limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while not query(url, "SELECT 1 FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND application_name = 'lethe'"):
        assert time.monotonic() < deadline, "no forget ever waited for the synchronous replica"
        time.sleep(POLL_S)


def test_replica_lag_is_a_metric(pair: ReplicaPair, server: LetheServer, http: httpx.Client, ns: str) -> None:
    assert wait_metric(server.url, "lethe_replica_up", lambda up: up == 1) == 1
    pair.pause_replay()
    _create(http, ns, "k", "x" * 2000)
    assert wait_metric(server.url, "lethe_replica_lag_bytes", lambda lag: lag > 0) > 0
    pair.resume_replay()
    pair.wait_caught_up()
    wait_metric(server.url, "lethe_replica_lag_bytes", lambda lag: lag == 0)
    assert wait_metric(server.url, "lethe_replica_lag_seconds", lambda lag: lag == 0) == 0
