"""LangGraph thread data at rest (issue 42, the threads slice; issue 44's "thread data encrypted";
docs/erasure-at-rest.md): no plaintext checkpoint, metadata, channel value or pending write in the database's files;
a thread delete punctures every leaf of the thread's rows (another thread's still open); a rewrite (what
LetheSaver.forget_message sends) and a run deletion shred exactly the rows they replaced or removed; a punctured leaf
under a live row (what a backup restored from before a delete holds) reads as absent, never as a 5xx; a ciphertext
moved to another row does not open; the key provider down answers 503 on a write and leaves a delete's shred pending
for the worker's sweep.

Everything is real: the suite's embedded PostgreSQL and server, its local key store. SQL only looks at the tables
(one test moves a ciphertext, as an attacker with the database would); a keyring built here is a fresh process's over
the same key store, with nothing cached. The LangGraph side (the conformance suite over these routes) is
clients/python/tests/test_langgraph_saver.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from app.db.database import Database
from app.keys.errors import Tampered
from app.keys.keyring import Keyring
from app.keys.local import LocalProvider
from app.keys.verify import VerifyReport, verify
from app.threads.endpoints import get_threads
from app.threads.repositories.sealing import SEALED_COLUMNS, blob_binding, write_binding
from tests.support import OverrideService, derives, files_holding, fresh_keyring, problem, sql, sweep_shreds


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _thread() -> str:
    return "rest-" + uuid.uuid4().hex[:12]


def _put(client: httpx.Client, thread: str, cid: str, *, parent: str | None = None, value: bytes = b"hello",
         metadata: dict[str, Any] | None = None, version: str = "1") -> httpx.Response:
    body = {
        "checkpoint_ns": "", "parent_id": parent, "checkpoint": {"type": "msgpack", "data": b64(b"cp:" + value)},
        "metadata": metadata if metadata is not None else {"source": "loop", "step": 0},
        "channel_versions": {"messages": version},
        "blobs": [{"channel": "messages", "version": version, "type": "msgpack", "data": b64(value)}],
    }
    return client.put(f"/v1/threads/{thread}/checkpoints/{cid}", json=body)


def _put_writes(client: httpx.Client, thread: str, cid: str, value: bytes, task: str = "task-1") -> httpx.Response:
    return client.post(f"/v1/threads/{thread}/checkpoints/{cid}/writes", json={
        "task_id": task, "writes": [{"idx": 0, "channel": "messages", "type": "msgpack", "data": b64(value)}],
    })


def _leaves(database_url: str, thread: str) -> dict[str, set[int]]:
    """Every leaf the thread's rows name, per table."""
    found = {}
    for table in ("thread_checkpoints", "thread_blobs", "thread_writes"):
        rows = sql(database_url, f"SELECT leaf FROM {table} WHERE thread_id = $1", thread)
        found[table] = {r["leaf"] for r in rows}
    return found


def _tenant(database_url: str, thread: str) -> str:
    tenant_id: str = sql(database_url, "SELECT tenant_id FROM threads WHERE thread_id = $1", thread)[0]["tenant_id"]
    return tenant_id


def test_no_plaintext_checkpoint_metadata_value_or_write_reaches_the_database_files(
    client: httpx.Client, database_url: str, data_dir: Path
) -> None:
    thread, marker = _thread(), f"okapi{uuid.uuid4().hex[:12]}"
    value, meta, written = f"value {marker}-v".encode(), f"{marker}-m", f"write {marker}-w".encode()
    assert _put(client, thread, "c1", value=value, metadata={"source": "input", "note": meta}).status_code == 200
    assert _put_writes(client, thread, "c1", written).status_code == 200
    got = client.get(f"/v1/threads/{thread}/checkpoints/c1").json()  # the routes give it all back, opened
    assert base64.b64decode(got["blobs"][0]["data"]) == value and got["metadata"]["note"] == meta
    assert base64.b64decode(got["writes"][0]["data"]) == written
    assert base64.b64decode(got["checkpoint"]["data"]) == b"cp:" + value
    [row] = sql(database_url, "SELECT metadata, metadata_sealed, leaf FROM thread_checkpoints WHERE thread_id = $1",
                thread)
    assert row["metadata"] is None and row["metadata_sealed"] is not None and row["leaf"] is not None
    sql(database_url, "CHECKPOINT")  # heap pages to their files; the WAL holds every change already

    found = files_holding(data_dir / "pg", [marker.encode(), thread.encode()])
    assert found[thread.encode()], "the scan does not see what the database wrote"  # ids are in the clear
    assert found[marker.encode()] == []


def test_a_thread_delete_punctures_every_leaf_of_its_rows_and_no_other(
    client: httpx.Client, database_url: str, live_server: Any
) -> None:
    thread, other = _thread(), _thread()
    for t in (thread, other):
        assert _put(client, t, "c1").status_code == 200
        assert _put_writes(client, t, "c1", b"w1").status_code == 200
        assert _put(client, t, "c2", parent="c1", value=b"more", version="2").status_code == 200
    leaves, others = _leaves(database_url, thread), _leaves(database_url, other)
    mine = set().union(*leaves.values())
    assert {table: len(found) for table, found in leaves.items()} == {
        "thread_checkpoints": 2, "thread_blobs": 2, "thread_writes": 1,
    }
    assert len(mine) == 5 and not mine & set().union(*others.values())  # a leaf per row, never shared
    tenant_id = _tenant(database_url, thread)

    deleted = client.delete(f"/v1/threads/{thread}")
    assert deleted.status_code == 200 and deleted.json()["deleted_checkpoints"] == 2
    keyring = fresh_keyring(live_server)
    assert [leaf for leaf in mine if derives(keyring, tenant_id, leaf)] == []  # shredded before it answered
    assert all(derives(keyring, tenant_id, leaf) for leaf in set().union(*others.values()))
    assert sql(database_url, "SELECT count(*) AS n FROM thread_pending_shreds")[0]["n"] == 0
    kept = client.get(f"/v1/threads/{other}/checkpoints").json()["checkpoints"]
    assert [c["checkpoint_id"] for c in kept] == ["c2", "c1"]

    # A prune keeping the latest shreds the older checkpoint, its write and the blob only it used; nothing else.
    rows = {(r["checkpoint_id"], r["leaf"]) for r in sql(
        database_url, "SELECT checkpoint_id, leaf FROM thread_checkpoints WHERE thread_id = $1", other)}
    [old_blob] = sql(database_url, "SELECT leaf FROM thread_blobs WHERE thread_id = $1 AND version = '1'", other)
    pruned = client.post("/v1/threads:prune", json={"thread_ids": [other], "strategy": "keep_latest"})
    assert pruned.status_code == 200 and pruned.json()["deleted_checkpoints"] == 1
    keyring = fresh_keyring(live_server)
    gone = {leaf for cid, leaf in rows if cid == "c1"} | others["thread_writes"] | {old_blob["leaf"]}
    assert [leaf for leaf in gone if derives(keyring, tenant_id, leaf)] == []
    assert all(derives(keyring, tenant_id, leaf) for leaf in set().union(*_leaves(database_url, other).values()))


def test_a_rewrite_shreds_the_rows_it_replaced_and_a_run_delete_the_rows_it_removed(
    client: httpx.Client, database_url: str, live_server: Any
) -> None:
    """forget_message's request: the blobs holding the message rewritten, a write dropped."""
    thread = _thread()
    run_a, run_b = f"run-a-{thread}", f"run-b-{thread}"  # run ids are tenant-wide: the conformance suite's are simple
    assert _put(client, thread, "c1", value=b"keep", metadata={"source": "loop", "run_id": run_a}).status_code == 200
    assert _put(client, thread, "c2", parent="c1", value=b"secret", version="2",
                metadata={"source": "loop", "run_id": run_b}).status_code == 200
    assert _put_writes(client, thread, "c2", b"secret write").status_code == 200
    tenant_id = _tenant(database_url, thread)
    blob_leaf = {r["version"]: r["leaf"] for r in sql(
        database_url, "SELECT version, leaf FROM thread_blobs WHERE thread_id = $1", thread)}
    [write] = sql(database_url, "SELECT leaf FROM thread_writes WHERE thread_id = $1", thread)

    values = client.get(f"/v1/threads/{thread}/values").json()
    rewrite = client.post(f"/v1/threads/{thread}/rewrite", json={
        "revision": values["revision"],
        "blobs": [{"checkpoint_ns": "", "channel": "messages", "version": "2", "type": "msgpack", "data": b64(b"")}],
        "drop_writes": [{"checkpoint_ns": "", "checkpoint_id": "c2", "task_id": "task-1", "idx": 0}],
    })
    assert rewrite.status_code == 200, rewrite.text
    keyring = fresh_keyring(live_server)
    assert not derives(keyring, tenant_id, blob_leaf["2"]) and not derives(keyring, tenant_id, write["leaf"])
    assert derives(keyring, tenant_id, blob_leaf["1"])  # the survivor keeps its leaf and its ciphertext
    [fresh] = sql(database_url, "SELECT leaf FROM thread_blobs WHERE thread_id = $1 AND version = '2'", thread)
    assert fresh["leaf"] not in blob_leaf.values() and derives(keyring, tenant_id, fresh["leaf"])
    got = client.get(f"/v1/threads/{thread}/checkpoints/c2").json()
    assert [base64.b64decode(b["data"]) for b in got["blobs"]] == [b""] and got["writes"] == []

    # delete_for_runs finds run b's checkpoint by the clear run_id and shreds its row, and the blob only it used.
    [c2] = sql(database_url, "SELECT leaf FROM thread_checkpoints WHERE thread_id = $1 AND checkpoint_id = 'c2'",
               thread)
    gone = client.post("/v1/threads:delete_for_runs", json={"run_ids": [run_b]})
    assert gone.status_code == 200 and gone.json()["deleted_checkpoints"] == 1
    keyring = fresh_keyring(live_server)  # the first one cached the covers from before this shred
    assert not derives(keyring, tenant_id, c2["leaf"]) and not derives(keyring, tenant_id, fresh["leaf"])
    assert derives(keyring, tenant_id, blob_leaf["1"])
    filtered = client.get(f"/v1/threads/{thread}/checkpoints", params={"metadata": json.dumps({"run_id": run_a})})
    assert [c["checkpoint_id"] for c in filtered.json()["checkpoints"]] == ["c1"]


def test_a_punctured_leaf_under_a_live_row_reads_as_absent(
    client: httpx.Client, database_url: str, live_server: Any
) -> None:
    """What a database restored from a backup taken before a delete holds: live rows whose leaves are punctured."""
    thread = _thread()
    assert _put(client, thread, "c1").status_code == 200
    assert _put_writes(client, thread, "c1", b"w").status_code == 200
    assert _put(client, thread, "c2", parent="c1", value=b"two", version="2").status_code == 200
    tenant_id = _tenant(database_url, thread)
    [blob] = sql(database_url, "SELECT leaf FROM thread_blobs WHERE thread_id = $1 AND version = '1'", thread)
    [write] = sql(database_url, "SELECT leaf FROM thread_writes WHERE thread_id = $1", thread)
    [c2] = sql(database_url, "SELECT leaf FROM thread_checkpoints WHERE thread_id = $1 AND checkpoint_id = 'c2'",
               thread)
    punctured = [blob["leaf"], write["leaf"], c2["leaf"]]
    asyncio.run(fresh_keyring(live_server).shred(tenant_id, punctured))
    live_server.app.state.container.sealer.forget_cached(tenant_id, punctured)  # what the announcement does

    c1 = client.get(f"/v1/threads/{thread}/checkpoints/c1")
    assert c1.status_code == 200 and c1.json()["blobs"] == [] and c1.json()["writes"] == []
    assert client.get(f"/v1/threads/{thread}/checkpoints/c2").status_code == 404
    listed = client.get(f"/v1/threads/{thread}/checkpoints", params={"limit": 1})
    assert [c["checkpoint_id"] for c in listed.json()["checkpoints"]] == ["c1"]  # the page looked past c2
    values = client.get(f"/v1/threads/{thread}/values").json()
    assert [b["version"] for b in values["blobs"]] == ["2"] and values["writes"] == []


def test_a_ciphertext_moved_to_another_row_does_not_open(
    client: httpx.Client, database_url: str, live_server: Any
) -> None:
    thread, other = _thread(), _thread()
    assert _put(client, thread, "c1", value=b"mine").status_code == 200
    assert _put(client, other, "c1", value=b"theirs").status_code == 200
    assert _put_writes(client, thread, "c1", b"mine too").status_code == 200
    tenant_id = _tenant(database_url, thread)
    [blob] = sql(database_url, "SELECT blob, leaf FROM thread_blobs WHERE thread_id = $1", thread)
    [write] = sql(database_url, "SELECT blob, leaf FROM thread_writes WHERE thread_id = $1", thread)
    keyring = fresh_keyring(live_server)
    for binding, ciphertext in (
        (blob_binding(tenant_id, other, "", "messages", "1"), blob["blob"]),  # the other thread's row
        (blob_binding(tenant_id, thread, "", "messages", "2"), blob["blob"]),  # another version
        (write_binding(tenant_id, thread, "", "c1", "task-1", 1), write["blob"]),  # another index
        (blob_binding(tenant_id, thread, "", "messages", "1"), write["blob"]),  # another table
    ):
        with pytest.raises(Tampered):
            asyncio.run(keyring.unseal(binding, ciphertext))
    # The database refuses a ciphertext under another row's leaf number (its envelope names its own).
    with pytest.raises(asyncpg.CheckViolationError):
        sql(database_url, "UPDATE thread_blobs SET blob = $1 WHERE thread_id = $2", write["blob"], other)


def _verify(database_url: str, tenant_id: str) -> VerifyReport:
    """`lethe keys verify` over the thread tables (their declarations in app/keys/admin.py SEALED)."""
    async def run() -> VerifyReport:
        db = Database(database_url, pool_size=1)
        try:
            keyring = Keyring(LocalProvider(Path(os.environ["LETHE_KEY_DIR"])), creates=False)
            return await verify(db, keyring, SEALED_COLUMNS, tenant=tenant_id)
        finally:
            await db.close()

    return asyncio.run(run())


def test_a_row_from_before_sealing_reads_filters_copies_and_deletes_as_before(
    client: httpx.Client, database_url: str
) -> None:
    thread, target = _thread(), _thread()
    legacy_run = f"legacy-{thread}"
    assert _put(client, thread, "c1", parent=None).status_code == 200
    tenant_id = _tenant(database_url, thread)
    # A checkpoint and its blob as migration 0012 wrote them: the saver's bytes, clear metadata, no leaf.
    sql(database_url, "INSERT INTO thread_checkpoints (tenant_id, thread_id, checkpoint_ns, checkpoint_id, type,"
        " checkpoint, metadata, versions, generation) VALUES ($1, $2, '', 'c0', 'msgpack', $3, $4::jsonb,"
        " '{\"messages\": \"0\"}'::jsonb, 0)",
        tenant_id, thread, b"legacy checkpoint", json.dumps({"source": "input", "run_id": legacy_run}))
    sql(database_url, "INSERT INTO thread_blobs (tenant_id, thread_id, checkpoint_ns, channel, version, type, blob)"
        " VALUES ($1, $2, '', 'messages', '0', 'msgpack', $3)", tenant_id, thread, b"legacy blob")

    got = client.get(f"/v1/threads/{thread}/checkpoints/c0").json()
    assert base64.b64decode(got["checkpoint"]["data"]) == b"legacy checkpoint"
    assert [base64.b64decode(b["data"]) for b in got["blobs"]] == [b"legacy blob"]
    inputs = client.get(f"/v1/threads/{thread}/checkpoints", params={"metadata": json.dumps({"source": "input"})})
    assert [c["checkpoint_id"] for c in inputs.json()["checkpoints"]] == ["c0"]
    report = _verify(database_url, tenant_id)  # legacy plaintext is not taken for a ciphertext
    assert report.healthy and sum(t.counts["ok"] for t in report.tables) > 0

    copied = client.post(f"/v1/threads/{thread}/copy", json={"target_thread_id": target})
    assert copied.status_code == 200 and copied.json()["copied_checkpoints"] == 2
    rows = sql(database_url, "SELECT leaf, metadata FROM thread_checkpoints WHERE thread_id = $1", target)
    assert all(r["leaf"] is not None and r["metadata"] is None for r in rows)  # sealed afresh for the target
    again = client.get(f"/v1/threads/{target}/checkpoints/c0").json()
    assert [base64.b64decode(b["data"]) for b in again["blobs"]] == [b"legacy blob"]

    gone = client.post("/v1/threads:delete_for_runs", json={"run_ids": [legacy_run]})
    assert gone.json()["deleted_checkpoints"] == 2  # the legacy row, and its sealed copy (by the clear run_id)
    assert [c["checkpoint_id"] for c in client.get(f"/v1/threads/{thread}/checkpoints").json()["checkpoints"]] == [
        "c1"
    ]


@pytest.fixture
def provider_down(tmp_path: Path, override_service: OverrideService) -> Path:
    """For this test, the thread routes are served by a container whose key store cannot be read (a file where its
    directory should be), with nothing cached: every key it needs is `Unavailable`."""
    blocked = tmp_path / "keys-down"
    blocked.write_text("not a directory")
    override_service(get_threads, "threads", key_dir=blocked)
    return blocked


@pytest.mark.usefixtures("provider_down")
def test_a_write_needing_an_unreachable_key_answers_503_and_writes_nothing(
    client: httpx.Client, database_url: str
) -> None:
    thread = _thread()
    answer = _put(client, thread, "c1")
    assert problem(answer, 503)["type"].endswith("keys-unavailable") and int(answer.headers["Retry-After"]) > 0
    assert sql(database_url, "SELECT count(*) AS n FROM threads WHERE thread_id = $1", thread)[0]["n"] == 0


def test_a_delete_whose_shred_the_provider_refused_stays_pending_until_the_sweep(
    client: httpx.Client, database_url: str, live_server: Any, tmp_path: Path, override_service: OverrideService,
    caplog: pytest.LogCaptureFixture,
) -> None:
    thread = _thread()
    assert _put(client, thread, "c1").status_code == 200
    tenant_id = _tenant(database_url, thread)
    mine = set().union(*_leaves(database_url, thread).values())
    blocked = tmp_path / "keys-down"
    blocked.write_text("not a directory")
    override_service(get_threads, "threads", key_dir=blocked)
    with caplog.at_level(logging.WARNING, logger="app.threads.shredding"):
        deleted = client.delete(f"/v1/threads/{thread}")
    assert deleted.status_code == 200, deleted.text  # the delete committed: live erasure does not wait for keys
    assert any("shred pending" in r.getMessage() for r in caplog.records)

    sweep_shreds(database_url, live_server)
    assert sql(database_url, "SELECT count(*) AS n FROM thread_pending_shreds")[0]["n"] == 0
    keyring = fresh_keyring(live_server)
    assert [leaf for leaf in mine if derives(keyring, tenant_id, leaf)] == []
