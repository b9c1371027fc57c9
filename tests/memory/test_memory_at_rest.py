"""Memory values at rest (issue 42, the memory slice; docs/erasure-at-rest.md): no plaintext value in the database's
files, a DELETE shreds its record incarnation's leaf (every copy of its ciphertexts stops opening), a punctured leaf
under a live row (what a backup restored from before a forget holds) reads as forgotten and never as a 5xx, a
ciphertext moved elsewhere does not open, tenants' keys are apart, and a write racing a forget cannot bring the value
back nor reuse the shredded leaf.

Everything is real: the suite's embedded PostgreSQL and server, its local key store. SQL only looks at the tables
(one test writes a ciphertext where it does not belong, as an attacker with the database would); a keyring built
here is a fresh process's over the same key store, with nothing cached.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from app.db.database import Database
from app.db.notifications import JobEvents, announce_shred
from app.errors import PreconditionFailed
from app.keys.content import Sealer
from app.keys.envelope import Binding
from app.keys.errors import Erased, Tampered
from app.keys.keyring import Keyring
from app.memory.endpoints import get_memory
from app.memory.repositories.sealing import RECORDS, VERSIONS, binding
from app.memory.service import MemoryService
from tests.memory.memory_helpers import create, write
from tests.support import OverrideService, files_holding, fresh_keyring, problem, sealer_of, sql, sweep_shreds

BARRIER_S = 60.0  # how long a barrier may wait for the other side before the test fails (it never waits for time)


def _tenant(database_url: str, name: str = "default") -> str:
    tenant_id: str = sql(database_url, "SELECT id FROM tenants WHERE name = $1", name)[0]["id"]
    return tenant_id


def _other_tenant(database_url: str, ns: str, key: str) -> str:
    """The tenant other than `default` that wrote `key` in `ns`."""
    rows = sql(
        database_url, "SELECT tenant_id FROM memory_records WHERE namespace = $1 AND key = $2 AND tenant_id <> $3",
        ns, key, _tenant(database_url),
    )
    [row] = rows
    tenant_id: str = row["tenant_id"]
    return tenant_id


def _head(database_url: str, ns: str, key: str, tenant_id: str) -> asyncpg.Record:
    [row] = sql(
        database_url,
        "SELECT version, leaf, value, value_sealed FROM memory_records"
        " WHERE tenant_id = $1 AND namespace = $2 AND key = $3",
        tenant_id, ns, key,
    )
    return row


def _unseal(keyring: Keyring, where: Binding, ciphertext: bytes) -> bytes:
    return asyncio.run(keyring.unseal(where, ciphertext))



def test_no_plaintext_value_reaches_the_database_files(
    client: httpx.Client, ns: str, database_url: str, data_dir: Path
) -> None:
    marker = f"passport-{uuid.uuid4().hex}"
    key = f"doc-{uuid.uuid4().hex[:16]}"
    create(client, ns, key, {"passport": marker})
    assert write(client, ns, key, [marker, {"again": marker}], base=1).status_code == 200
    assert client.get(f"/v1/memory/{ns}/{key}").json()["value"] == [marker, {"again": marker}]
    sql(database_url, "CHECKPOINT")  # heap pages to their files; the WAL holds every change already

    found = files_holding(data_dir / "pg", [marker.encode(), key.encode()])
    # The control: key names are stored in the clear (ids may be), so the same scan finds this one.
    assert found[key.encode()], "the scan does not see what the database wrote"
    assert found[marker.encode()] == []


def test_a_delete_shreds_every_version_of_the_incarnation(
    client: httpx.Client, ns: str, database_url: str, live_server: Any
) -> None:
    tenant_id = _tenant(database_url)
    create(client, ns, "allergy", "peanut")
    assert write(client, ns, "allergy", {"nested": ["sesame"]}, base=1).status_code == 200
    head = _head(database_url, ns, "allergy", tenant_id)
    history = sql(
        database_url,
        "SELECT version, leaf, value_sealed FROM memory_versions WHERE tenant_id = $1 AND namespace = $2"
        " ORDER BY version",
        tenant_id, ns,
    )
    assert head["value"] is None and {r["leaf"] for r in history} == {head["leaf"]}  # one leaf per incarnation
    sealed = [(binding(tenant_id, VERSIONS, ns, "allergy", r["version"]), r["value_sealed"]) for r in history]
    sealed.append((binding(tenant_id, RECORDS, ns, "allergy", head["version"]), head["value_sealed"]))
    before = fresh_keyring(live_server)
    opened = [_unseal(before, where, ct) for where, ct in sealed]
    assert opened == [b'"peanut"', b'{"nested":["sesame"]}', b'{"nested":["sesame"]}']

    forgot = client.delete(f"/v1/memory/{ns}/allergy")
    assert forgot.status_code == 200, forgot.text
    job = client.get(f"/v1/forget/{forgot.json()['forget_id']}").json()
    horizon = live_server.app.state.container.settings.erasure_horizon_s
    assert job["erasure"]["live"] == "complete" and job["erasure"]["at_rest"] == "complete"
    assert job["erasure"]["at_rest_complete_at"] is not None and job["erasure"]["horizon_s"] == horizon
    [row] = sql(database_url, "SELECT shred_leaves FROM forget_jobs WHERE id = $1", job["id"])
    assert row["shred_leaves"] == [head["leaf"]]

    # Every copy of those bytes (a backup, the WAL, a replica) is noise now, for any process of the deployment.
    after = fresh_keyring(live_server)
    for where, ciphertext in sealed:
        with pytest.raises(Erased):
            _unseal(after, where, ciphertext)


def test_a_forget_request_with_a_memory_target_shreds_as_a_delete_does(
    client: httpx.Client, ns: str, database_url: str, live_server: Any
) -> None:
    tenant_id = _tenant(database_url)
    create(client, ns, "k", "v")
    head = _head(database_url, ns, "k", tenant_id)
    answer = client.post("/v1/forget", json={"target": {"memory": {"namespace": ns, "key": "k"}}, "wait": True})
    assert answer.status_code in (200, 202), answer.text
    job = client.get(f"/v1/forget/{answer.json()['id']}").json()
    assert job["memory"]["tombstone_version"] == 2 and job["erasure"]["at_rest"] == "complete"
    with pytest.raises(Erased):
        _unseal(fresh_keyring(live_server), binding(tenant_id, RECORDS, ns, "k", 1), head["value_sealed"])


def test_an_expiry_shreds_the_record_it_forgets(
    client: httpx.Client, ns: str, database_url: str, live_server: Any
) -> None:
    tenant_id = _tenant(database_url)
    written = client.put(
        f"/v1/memory/{ns}/k", json={"value": "brief", "source": "user", "ttl_s": 0}, headers={"If-None-Match": "*"}
    )
    assert written.status_code == 201, written.text
    head = _head(database_url, ns, "k", tenant_id)
    assert problem(client.get(f"/v1/memory/{ns}/k"), 404)["forgotten"] is True  # the read meets it expired
    [job] = sql(
        database_url, "SELECT shred_leaves, shredded_at FROM forget_jobs WHERE tenant_id = $1"
        " AND target -> 'memory' ->> 'namespace' = $2", tenant_id, ns,
    )
    assert job["shred_leaves"] == [head["leaf"]] and job["shredded_at"] is not None
    with pytest.raises(Erased):
        _unseal(fresh_keyring(live_server), binding(tenant_id, RECORDS, ns, "k", 1), head["value_sealed"])


def test_a_row_from_before_sealing_reads_and_its_forget_promises_nothing_at_rest(
    client: httpx.Client, ns: str, database_url: str, live_server: Any
) -> None:
    """A record written before migration 0016 (put in place here as that version wrote it: plaintext JSONB) reads as
    before; written again, its new version is sealed; forgotten, its leaf is shredded, but the receipt claims nothing
    at rest, since the plaintext's dead tuples stay on disk until the online migration (issue 42, step 6)."""
    tenant_id = _tenant(database_url)
    for table, columns, values in (
        ("memory_records", "version, value, forgotten, source, updated_at, created_at",
         "1, '\"old\"', false, 'user', now(), now()"),
        ("memory_versions", "version, op, value, source, at", "1, 'write', '\"old\"', 'user', now()"),
    ):
        sql(database_url, f"INSERT INTO {table} (tenant_id, namespace, key, {columns}) VALUES ($1, $2, 'k', {values})",
            tenant_id, ns)
    assert client.get(f"/v1/memory/{ns}/k").json()["value"] == "old"
    assert write(client, ns, "k", "new", base=1).status_code == 200
    head = _head(database_url, ns, "k", tenant_id)
    assert head["value"] is None and head["leaf"] is not None
    assert [v["value"] for v in client.get(f"/v1/memory/{ns}/k/history").json()["versions"]] == ["old", "new"]

    forgot = client.delete(f"/v1/memory/{ns}/k").json()
    job = client.get(f"/v1/forget/{forgot['forget_id']}").json()
    assert job["erasure"] is None  # part of what it erased was plaintext: no promise at rest
    [row] = sql(database_url, "SELECT shred_leaves, shredded_at FROM forget_jobs WHERE id = $1", job["id"])
    assert row["shred_leaves"] == [head["leaf"]] and row["shredded_at"] is not None  # the sealed part is shredded
    with pytest.raises(Erased):
        _unseal(fresh_keyring(live_server), binding(tenant_id, RECORDS, ns, "k", 2), head["value_sealed"])


def test_a_forget_that_erased_nothing_sealed_claims_nothing_at_rest(client: httpx.Client, ns: str) -> None:
    forgot = client.delete(f"/v1/memory/{ns}/never-written").json()
    job = client.get(f"/v1/forget/{forgot['forget_id']}").json()
    assert job["status"] == "succeeded" and job["erasure"] is None


def test_a_punctured_leaf_under_a_live_row_reads_as_forgotten(
    client: httpx.Client, ns: str, database_url: str, live_server: Any
) -> None:
    """What a database restored from a backup taken before a forget holds: live rows whose leaf is punctured."""
    tenant_id = _tenant(database_url)
    create(client, ns, "city", {"text": "Ghent"})
    assert write(client, ns, "city", {"text": "Bruges"}, base=1).status_code == 200
    create(client, ns, "diet", {"text": "vegetarian"})
    leaf = _head(database_url, ns, "city", tenant_id)["leaf"]
    asyncio.run(fresh_keyring(live_server).shred(tenant_id, [leaf]))
    # What the shred's notification does in the server's process (test_a_shred_is_announced_to_every_process).
    live_server.app.state.container.sealer.forget_cached(tenant_id, [leaf])

    gone = problem(client.get(f"/v1/memory/{ns}/city"), 404)
    assert gone["forgotten"] is True and gone["version"] == 2
    assert client.get(f"/v1/memory/{ns}").json()["keys"] == ["diet"]
    with_values = client.get(f"/v1/memory/{ns}", params={"values": "true"}).json()["records"]
    assert [(r["key"], r["value"]) for r in with_values] == [("diet", {"text": "vegetarian"})]
    hits = client.post("/v1/memory:search", json={"namespace_prefix": ns}).json()["items"]
    assert [h["key"] for h in hits] == ["diet"]
    versions = client.get(f"/v1/memory/{ns}/city/history").json()["versions"]
    assert [(v["version"], v["value"], v["erased"]) for v in versions] == [(1, None, True), (2, None, True)]
    assert client.get(f"/v1/memory/{ns}/diet").json()["value"] == {"text": "vegetarian"}
    # A new session injects the namespace's live records: the erased one is left out, never a ciphertext.
    created = client.post("/v1/sessions", json={"system_prompt": "You are terse.", "memory_namespace": ns})
    assert created.status_code == 201, created.text
    listed = client.get(f"/v1/sessions/{created.json()['id']}/artifacts").json()["artifacts"]
    memories = [(a["memory"]["key"], a["content"]) for a in listed if a["kind"] == "memory"]
    assert memories == [("diet", '{"text": "vegetarian"}')]

    # Re-established with the version it reads as forgotten: a new incarnation under a fresh leaf.
    assert write(client, ns, "city", {"text": "Antwerp"}, base=2).status_code == 200
    assert client.get(f"/v1/memory/{ns}/city").json()["value"] == {"text": "Antwerp"}
    assert _head(database_url, ns, "city", tenant_id)["leaf"] != leaf
    assert client.get(f"/v1/memory/{ns}").json()["keys"] == ["city", "diet"]


def test_a_ciphertext_moved_elsewhere_does_not_open(
    client: httpx.Client, ns: str, database_url: str, live_server: Any, other_tenant: httpx.Client
) -> None:
    tenant_id = _tenant(database_url)
    secret = f"secret-{uuid.uuid4().hex}"
    create(client, ns, "x", secret)
    create(client, ns, "y", "other")
    create(other_tenant, ns, "x", "theirs")
    other_id = _other_tenant(database_url, ns, "x")
    moved = _head(database_url, ns, "x", tenant_id)["value_sealed"]
    keyring = fresh_keyring(live_server)
    assert _unseal(keyring, binding(tenant_id, RECORDS, ns, "x", 1), moved) == f'"{secret}"'.encode()
    elsewhere = [
        binding(tenant_id, RECORDS, ns, "y", 1),  # another key
        binding(tenant_id, RECORDS, ns, "x", 2),  # another version
        binding(tenant_id, VERSIONS, ns, "x", 1),  # the history table
        binding(other_id, RECORDS, ns, "x", 1),  # another tenant's same-named key
    ]
    for where in elsewhere:
        with pytest.raises(Tampered):  # loud: never "erased", never the value
            _unseal(keyring, where, moved)

    # Written over another key's row by someone with the database: the server refuses to serve it, loudly.
    sql(
        database_url,
        "UPDATE memory_records SET value_sealed = $1 WHERE tenant_id = $2 AND namespace = $3 AND key = 'y'",
        moved, tenant_id, ns,
    )
    served = client.get(f"/v1/memory/{ns}/y")
    assert problem(served, 500)["type"].endswith("internal-error") and secret not in served.text


def test_one_tenants_delete_leaves_anothers_same_key_readable(
    client: httpx.Client, other_tenant: httpx.Client, ns: str, database_url: str, live_server: Any
) -> None:
    create(client, ns, "same", "mine")
    create(other_tenant, ns, "same", "theirs")
    forgot = client.delete(f"/v1/memory/{ns}/same").json()
    assert client.get(f"/v1/forget/{forgot['forget_id']}").json()["erasure"]["at_rest"] == "complete"

    assert other_tenant.get(f"/v1/memory/{ns}/same").json()["value"] == "theirs"
    other_id = _other_tenant(database_url, ns, "same")
    theirs = _head(database_url, ns, "same", other_id)
    assert _unseal(fresh_keyring(live_server), binding(other_id, RECORDS, ns, "same", 1), theirs["value_sealed"]) == (
        b'"theirs"'
    )


class _GatedSealer(Sealer):
    """Holds every seal at a barrier: the write has read the head and chosen its leaf, and sealed nothing yet."""

    def __init__(self, base: Sealer) -> None:
        super().__init__(base.keyring, base.leaves)
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def seal_json(self, leaf: int, where: Binding, value: Any) -> bytes:
        self.entered.set()
        await asyncio.wait_for(self.release.wait(), BARRIER_S)
        return await super().seal_json(leaf, where, value)


def test_a_write_in_flight_when_the_delete_commits_neither_lands_nor_reuses_the_leaf(
    client: httpx.Client, ns: str, database_url: str, live_server: Any
) -> None:
    tenant_id = _tenant(database_url)
    create(client, ns, "k", "before")
    leaf = _head(database_url, ns, "k", tenant_id)["leaf"]

    async def race() -> tuple[httpx.Response, PreconditionFailed]:
        db = Database(database_url, pool_size=2)
        try:
            sealer = _GatedSealer(sealer_of(live_server, db))
            # Another process's write based on version 1, stopped once it chose the incarnation's leaf.
            put = asyncio.create_task(
                MemoryService(db, sealer).write(tenant_id, ns, "k", value="during", source="user", base_version=1)
            )
            await asyncio.wait_for(sealer.entered.wait(), BARRIER_S)
            forgot = await asyncio.to_thread(client.delete, f"/v1/memory/{ns}/k")  # commits and shreds the leaf
            sealer.release.set()
            with pytest.raises(PreconditionFailed) as stale:
                await put
            with pytest.raises(Erased):  # the leaf it had chosen is punctured for it too: it took a fresh one
                await sealer.keyring.key(tenant_id, leaf)
            return forgot, stale.value
        finally:
            await db.close()

    forgot, stale = asyncio.run(race())
    assert forgot.status_code == 200 and forgot.json()["version"] == 2
    assert stale.extra["forgotten"] is True and stale.extra["current_version"] == 2
    assert problem(client.get(f"/v1/memory/{ns}/k"), 404)["forgotten"] is True
    rows = sql(
        database_url, "SELECT count(*) AS n FROM memory_versions WHERE tenant_id = $1 AND namespace = $2"
        " AND (value_sealed IS NOT NULL OR value IS NOT NULL)", tenant_id, ns,
    )
    assert rows[0]["n"] == 0  # nothing of either write survives in history

    assert write(client, ns, "k", "after", base=2).status_code == 200
    assert _head(database_url, ns, "k", tenant_id)["leaf"] != leaf  # a new incarnation, never the shredded leaf
    assert client.get(f"/v1/memory/{ns}/k").json()["value"] == "after"


@pytest.fixture
def provider_down(tmp_path: Path, override_service: OverrideService) -> Iterator[None]:
    """For this test, the memory routes are served by a container whose key store cannot be read (a file where its
    directory should be), with nothing cached: every key it needs is `Unavailable`."""
    blocked = tmp_path / "keys-down"
    blocked.write_text("not a directory")
    override_service(get_memory, "memory", key_dir=blocked)
    yield


@pytest.mark.usefixtures("provider_down")
def test_a_write_needing_an_unreachable_key_answers_503_and_writes_nothing(
    client: httpx.Client, ns: str, database_url: str
) -> None:
    answer = client.put(f"/v1/memory/{ns}/k", json={"value": "v", "source": "user"}, headers={"If-None-Match": "*"})
    assert problem(answer, 503)["type"].endswith("keys-unavailable") and int(answer.headers["Retry-After"]) > 0
    assert sql(database_url, "SELECT count(*) AS n FROM memory_records WHERE namespace = $1", ns)[0]["n"] == 0


def test_a_shred_the_provider_refused_stays_pending_until_a_retry(
    client: httpx.Client, ns: str, database_url: str, live_server: Any, tmp_path: Path,
    override_service: OverrideService, caplog: pytest.LogCaptureFixture,
) -> None:
    tenant_id = _tenant(database_url)
    create(client, ns, "k", "v")
    head = _head(database_url, ns, "k", tenant_id)
    blocked = tmp_path / "keys-down"
    blocked.write_text("not a directory")
    override_service(get_memory, "memory", key_dir=blocked)
    with caplog.at_level(logging.WARNING, logger="app.forget.shredding"):
        forgot = client.delete(f"/v1/memory/{ns}/k")
    assert forgot.status_code == 200, forgot.text  # the tombstone committed: live erasure does not wait for keys
    assert any("shred pending" in r.getMessage() for r in caplog.records)

    sweep_shreds(database_url, live_server)
    job = client.get(f"/v1/forget/{forgot.json()['forget_id']}").json()
    assert job["erasure"]["at_rest"] == "complete"
    with pytest.raises(Erased):
        _unseal(fresh_keyring(live_server), binding(tenant_id, RECORDS, ns, "k", 1), head["value_sealed"])


def test_a_shred_in_another_process_reaches_the_servers_key_cache(
    client: httpx.Client, ns: str, database_url: str, live_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant_id = _tenant(database_url)
    create(client, ns, "k", "cached")  # the server sealed it: it holds the leaf's cover in its cache
    leaf = _head(database_url, ns, "k", tenant_id)["leaf"]
    heard = threading.Event()
    events = live_server.app.state.container.job_events

    def shredded(tenant: str, leaves: list[int]) -> None:
        original(tenant, leaves)
        if leaf in leaves:
            heard.set()

    original = events.shredded
    monkeypatch.setattr(events, "shredded", shredded)

    async def announce() -> None:
        db = Database(database_url, pool_size=1)
        try:
            await announce_shred(db, tenant_id, [leaf])
        finally:
            await db.close()

    asyncio.run(fresh_keyring(live_server).shred(tenant_id, [leaf]))  # punctured in the provider, nobody told
    # Unannounced, the server still derives the key from its cached cover: the window the cache's time to live bounds.
    assert client.get(f"/v1/memory/{ns}/k").json()["value"] == "cached"
    asyncio.run(announce())  # what the shredding process's Sealer.shred does next
    assert heard.wait(BARRIER_S), "the server never heard the shred"
    assert problem(client.get(f"/v1/memory/{ns}/k"), 404)["forgotten"] is True


def test_a_shred_is_announced_to_every_process(database_url: str) -> None:
    async def listen() -> list[tuple[str, list[int]]]:
        heard: list[tuple[str, list[int]]] = []
        got = asyncio.Event()

        def shredded(tenant_id: str, leaves: list[int]) -> None:
            heard.append((tenant_id, leaves))
            got.set()

        db = Database(database_url, pool_size=1)
        events = JobEvents(database_url, asyncio.Event(), shredded=shredded)
        listening = asyncio.create_task(events.run())
        try:
            await asyncio.wait_for(events.listening.wait(), BARRIER_S)
            await announce_shred(db, "ten_elsewhere", [4096, 4097, 9])
            await asyncio.wait_for(got.wait(), BARRIER_S)
        finally:
            listening.cancel()
            await asyncio.gather(listening, return_exceptions=True)
            await db.close()
        return heard

    assert asyncio.run(listen()) == [("ten_elsewhere", [4096, 4097, 9])]


@pytest.mark.usefixtures("provider_down")
def test_a_delete_that_asks_to_shred_now_is_refused_while_the_provider_is_down(
    client: httpx.Client, ns: str, database_url: str
) -> None:
    """Without `shred=now` the tombstone commits and the shred waits for the provider (the test above); with it the
    DELETE is refused before anything is written."""
    refused = client.delete(f"/v1/memory/{ns}/k", params={"shred": "now"})
    assert problem(refused, 503)["type"].endswith("keys-unavailable") and int(refused.headers["Retry-After"]) > 0
    assert sql(database_url, "SELECT count(*) AS n FROM memory_records WHERE namespace = $1", ns)[0]["n"] == 0
    problem(client.delete(f"/v1/memory/{ns}/k", params={"shred": "soon"}), 422)


def test_a_delete_that_asks_to_shred_now_answers_once_shredded(
    client: httpx.Client, ns: str, database_url: str, live_server: Any
) -> None:
    tenant_id = _tenant(database_url)
    create(client, ns, "k", "v")
    head = _head(database_url, ns, "k", tenant_id)
    forgot = client.delete(f"/v1/memory/{ns}/k", params={"shred": "now"})
    assert forgot.status_code == 200, forgot.text
    job = client.get(f"/v1/forget/{forgot.json()['forget_id']}").json()
    assert job["erasure"]["at_rest"] == "complete" and job["erasure"]["at_rest_complete_at"] is not None
    with pytest.raises(Erased):
        _unseal(fresh_keyring(live_server), binding(tenant_id, RECORDS, ns, "k", 1), head["value_sealed"])


def test_a_shred_refused_after_the_tombstone_committed_answers_503_naming_its_job(
    ns: str, database_url: str, live_server: Any
) -> None:
    """The provider answered the check but refuses the shred (it went down in between): the key is forgotten, the
    answer is 503 `keys-unavailable` naming the job, and the worker's sweep completes the shred."""
    from app.forget.cascade import JobCascade
    from app.forget.shredding import Shredder
    from app.keys.errors import ShredPending, Unavailable

    tenant_id = _tenant(database_url)

    async def run() -> str:
        db = Database(database_url, pool_size=2)
        try:
            sealer = sealer_of(live_server, db)
            memory = MemoryService(db, sealer, cascade=JobCascade(sealer=sealer, shredder=Shredder(db, sealer)))
            await memory.write(tenant_id, ns, "k", value="v", base_version=0, source="user")

            async def refused(_tenant: str, _leaves: Any) -> None:
                raise Unavailable("the key provider went away")

            sealer.keyring.shred = refused  # the provider goes down between the check and the shred
            with pytest.raises(ShredPending) as pending:
                await memory.forget(tenant_id, ns, "k", shred_now=True)
            return str(pending.value.extra["forget_id"])
        finally:
            await db.close()

    forget_id = asyncio.run(run())
    [job] = sql(database_url, "SELECT shredded_at FROM forget_jobs WHERE id = $1", forget_id)
    assert job["shredded_at"] is None
    assert _head(database_url, ns, "k", tenant_id)["version"] == 2  # the tombstone committed
    sweep_shreds(database_url, live_server)
    [job] = sql(database_url, "SELECT shredded_at FROM forget_jobs WHERE id = $1", forget_id)
    assert job["shredded_at"] is not None


def test_what_a_search_opened_is_kept_by_the_leaf_and_goes_with_the_forget(
    client: httpx.Client, ns: str, database_url: str, live_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search keeps each record's opened value and its vectors under the record's leaf, so the next search opens
    and embeds nothing again; the forget of one record drops what was kept of it, and nothing of the others."""
    tenant_id = _tenant(database_url)
    create(client, ns, "code", {"text": "my locker code is 4471-ZQ"})
    create(client, ns, "bees", {"text": "I keep bees in the garden"})
    leaves = {key: _head(database_url, ns, key, tenant_id)["leaf"] for key in ("code", "bees")}
    sealer = live_server.app.state.container.sealer

    def kept(key: str) -> list[str]:
        return sorted(tag[0] for tag in sealer.opened.get((tenant_id, leaves[key])) or {})

    def search() -> list[str]:
        r = client.post("/v1/memory:search", json={"namespace_prefix": ns, "query": "locker code", "limit": 5})
        assert r.status_code == 200, r.text
        return [item["key"] for item in r.json()["items"]]

    assert search() == ["code", "bees"]
    assert kept("code") == kept("bees") == ["value", "vectors"]

    async def never(*_args: Any) -> Any:
        raise AssertionError("opened or embedded again")

    with monkeypatch.context() as patched:
        patched.setattr(sealer, "open_json", never)
        patched.setattr(live_server.app.state.container.services.memory_search.embedder, "embed", never)
        assert search() == ["code", "bees"]  # the query's vector is kept too, for the keys' time to live

    assert client.delete(f"/v1/memory/{ns}/code").status_code == 200
    assert kept("code") == [] and kept("bees") == ["value", "vectors"]
    assert search() == ["bees"]


def test_a_value_opened_while_its_forget_shreds_is_not_kept(
    client: httpx.Client, ns: str, database_url: str, live_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race `Sealer.keep` guards, forced with a barrier: a search has opened the value and not kept it yet when
    the DELETE shreds the record's leaf and answers. The search then finishes, and keeps nothing of that leaf."""
    tenant_id = _tenant(database_url)
    create(client, ns, "code", {"text": "my locker code is 4471-ZQ"})
    leaf = _head(database_url, ns, "code", tenant_id)["leaf"]
    sealer = live_server.app.state.container.sealer
    original = sealer.open_json
    opened, release = threading.Event(), threading.Event()

    async def parked(where: Binding, ciphertext: bytes) -> Any:
        value = await original(where, ciphertext)
        if where.tenant == tenant_id and json.loads(where.row)[:2] == [ns, "code"]:
            opened.set()  # opened, not yet kept: the moment the forget lands in
            await asyncio.to_thread(release.wait, BARRIER_S)
        return value

    monkeypatch.setattr(sealer, "open_json", parked)
    with httpx.Client(base_url=client.base_url, headers=client.headers, timeout=BARRIER_S) as searcher, \
            ThreadPoolExecutor(1) as pool:
        searching = pool.submit(searcher.post, "/v1/memory:search", json={"namespace_prefix": ns})
        assert opened.wait(BARRIER_S), "the search never opened the value"
        assert client.delete(f"/v1/memory/{ns}/code").status_code == 200  # shredded before it answers
        release.set()
        found = searching.result(timeout=BARRIER_S)
    assert found.status_code == 200, found.text
    assert sealer.opened.get((tenant_id, leaf)) is None
    assert [i["key"] for i in client.post("/v1/memory:search", json={"namespace_prefix": ns}).json()["items"]] == []
