"""`lethe keys seal`: the upgrade's online migration of plaintext written before sealing (issue 42, step 6;
docs/erasure-at-rest.md, "Upgrading"). Rows are put back in the clear here exactly as the versions before
migrations 0016 and 0017 wrote them; the command seals them under the leaves the live code would have chosen, the
API reads them back unchanged, `lethe keys verify` opens them, a forget of one now promises its erasure at rest,
`--vacuum full` leaves no copy in the tables' files, and a row a writer holds is skipped, reported, and sealed by
the next run.

Against the run's real PostgreSQL, local key store and server.
"""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
from typer.testing import CliRunner, Result

from app.cli import cli
from tests.forget.forget_helpers import artifacts, forget, run_script, user
from tests.memory.memory_helpers import create, write
from tests.support import HeldLock, files_holding, sql, stored_artifacts, stored_environments

FAST = {"temperature": 0, "max_tokens": 4, "seed": 3}


def _seal(database_url: str, *args: str) -> tuple[Result, dict[str, Any]]:
    result = CliRunner().invoke(cli, ["keys", "seal", "--json", *args], env={"LETHE_DATABASE_URL": database_url})
    return result, (json.loads(result.stdout) if result.stdout.startswith("{") else {})


def _tenant(database_url: str) -> str:
    tenant_id: str = sql(database_url, "SELECT id FROM tenants WHERE name = 'default'")[0]["id"]
    return tenant_id


def _in_the_clear_again(database_url: str, session_id: str) -> list[dict[str, Any]]:
    """The session's artifacts as the version before 0017 stored them: text and token ids in the clear, no leaf."""
    rows = stored_artifacts(database_url, "WHERE session_id = $1", session_id)
    for row in rows:
        vector = None if row["embedding"] is None else str(list(row["embedding"]))
        sql(database_url, "UPDATE artifacts SET content = $2, token_ids = $3, embedding = CAST($4 AS vector), "
            "content_sealed = NULL, token_ids_sealed = NULL, embedding_sealed = NULL, leaf = NULL WHERE id = $1",
            row["id"], row["content"], row["token_ids"], vector)
    return rows


def _legacy_memory(database_url: str, tenant_id: str, ns: str, key: str, values: list[str]) -> None:
    """A record written twice before 0016: its head and both history rows hold plaintext JSONB."""
    sql(database_url, "INSERT INTO memory_records (tenant_id, namespace, key, version, value, forgotten, source, "
        "updated_at, created_at) VALUES ($1, $2, $3, $4, to_jsonb($5::text), false, 'user', now(), now())",
        tenant_id, ns, key, len(values), values[-1])
    for version, value in enumerate(values, start=1):
        sql(database_url, "INSERT INTO memory_versions (tenant_id, namespace, key, version, op, value, source, at) "
            "VALUES ($1, $2, $3, $4, 'write', to_jsonb($5::text), 'user', now())", tenant_id, ns, key, version, value)


def _clear_rows(database_url: str, tenant_id: str, ns: str, session_id: str) -> int:
    [row] = sql(database_url, """
        SELECT (SELECT count(*) FROM memory_records WHERE tenant_id = $1 AND namespace = $2 AND value IS NOT NULL)
             + (SELECT count(*) FROM memory_versions WHERE tenant_id = $1 AND namespace = $2 AND value IS NOT NULL)
             + (SELECT count(*) FROM artifacts WHERE session_id = $3 AND leaf IS NULL) AS n""",
        tenant_id, ns, session_id)
    return int(row["n"])


def test_seal_turns_an_upgraded_databases_plaintext_into_ciphertext_that_reads_the_same(
    client: httpx.Client, database_url: str, data_dir: Path
) -> None:
    tenant_id, ns, marker = _tenant(database_url), "legacy-" + uuid.uuid4().hex[:8], f"okapi{uuid.uuid4().hex[:10]}"
    _legacy_memory(database_url, tenant_id, ns, "old", [f"first {marker}", f"second {marker}"])
    create(client, ns, "mixed", "x")  # v1 sealed; its history row put back in the clear: written before, read after
    sql(database_url, "UPDATE memory_versions SET value = to_jsonb($3::text), value_sealed = NULL "
        "WHERE tenant_id = $1 AND namespace = $2 AND key = 'mixed'", tenant_id, ns, f"mixed {marker}")
    session_id, _ = run_script(client, [[user(f"My code is {marker}.")], [user("Thanks.")]], FAST)
    before = _in_the_clear_again(database_url, session_id)
    history = client.get(f"/v1/memory/{ns}/old/history").json()["versions"]
    assert [v["value"] for v in history] == [f"first {marker}", f"second {marker}"]  # legacy rows read as before
    assert _clear_rows(database_url, tenant_id, ns, session_id) == 3 + 1 + len(before)

    result, done = _seal(database_url, "--batch", "2", "--vacuum", "full")  # pages of 2: cursors across pages
    assert result.exit_code == 0, result.stdout + result.stderr
    assert not any(done["left"].values()) and done["sealed"]["memory"] >= 4
    assert done["sealed"]["artifacts"] >= len(before) and done["vacuum"] == "full"
    assert _clear_rows(database_url, tenant_id, ns, session_id) == 0

    # One leaf per incarnation: the legacy record's head and history share a fresh one; the mixed record's old
    # history row joined its head's.
    leaves = sql(database_url, "SELECT key, array_agg(DISTINCT leaf) AS leaves FROM (SELECT key, leaf FROM "
                 "memory_records WHERE tenant_id = $1 AND namespace = $2 UNION ALL SELECT key, leaf FROM "
                 "memory_versions WHERE tenant_id = $1 AND namespace = $2) AS rows GROUP BY key", tenant_id, ns)
    assert all(len(r["leaves"]) == 1 and r["leaves"][0] is not None for r in leaves), leaves
    assert [v["value"] for v in client.get(f"/v1/memory/{ns}/old/history").json()["versions"]] == [
        f"first {marker}", f"second {marker}"]
    assert client.get(f"/v1/memory/{ns}/mixed/history").json()["versions"][0]["value"] == f"mixed {marker}"
    after = stored_artifacts(database_url, "WHERE session_id = $1", session_id)
    assert {r["id"]: (r["content"], r["token_ids"]) for r in after} == {
        r["id"]: (r["content"], r["token_ids"]) for r in before}
    assert sorted(a["content"] for a in artifacts(client, session_id)) == sorted(r["content"] for r in before)

    # VACUUM FULL rewrote the tables: their files hold no copy (the WAL written before does: no shred reaches it).
    sql(database_url, "CHECKPOINT")
    assert files_holding(data_dir / "pg" / "base", [marker.encode()])[marker.encode()] == []
    verified = CliRunner().invoke(cli, ["keys", "verify", "--tenant", "default"],
                                  env={"LETHE_DATABASE_URL": database_url})
    assert verified.exit_code == 0, verified.stdout

    # Sealed now, a forget of it promises (and delivers) its erasure at rest, history included.
    assert write(client, ns, "old", "third", base=2).status_code == 200
    forgot = client.delete(f"/v1/memory/{ns}/old").json()
    job = client.get(f"/v1/forget/{forgot['forget_id']}").json()
    assert job["erasure"]["at_rest"] == "complete", job


def test_seal_takes_thread_data_from_before_0020_and_runs_are_still_found(
    client: httpx.Client, database_url: str
) -> None:
    thread, run = "legacy-" + uuid.uuid4().hex[:10], "run-" + uuid.uuid4().hex[:8]
    body = {"checkpoint_ns": "", "parent_id": None, "checkpoint": {"type": "msgpack", "data": _b64(b"new")},
            "metadata": {"source": "loop", "step": 1}, "channel_versions": {}, "blobs": []}
    assert client.put(f"/v1/threads/{thread}/checkpoints/c1", json=body).status_code == 200
    [row] = sql(database_url, "SELECT tenant_id FROM threads WHERE thread_id = $1", thread)
    # A checkpoint, its channel value and a pending write as migration 0012 wrote them: clear bytes, no leaf.
    sql(database_url, "INSERT INTO thread_checkpoints (tenant_id, thread_id, checkpoint_ns, checkpoint_id, type, "
        "checkpoint, metadata, versions, generation) VALUES ($1, $2, '', 'c0', 'msgpack', $3, $4::jsonb, "
        "'{\"messages\": \"0\"}'::jsonb, 0)", row["tenant_id"], thread, b"old checkpoint",
        json.dumps({"source": "input", "run_id": run}))
    sql(database_url, "INSERT INTO thread_blobs (tenant_id, thread_id, checkpoint_ns, channel, version, type, blob) "
        "VALUES ($1, $2, '', 'messages', '0', 'msgpack', $3)", row["tenant_id"], thread, b"old blob")
    sql(database_url, "INSERT INTO thread_writes (tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx, "
        "channel, type, blob) VALUES ($1, $2, '', 'c0', 't', 0, 'messages', 'msgpack', $3)",
        row["tenant_id"], thread, b"old write")

    result, done = _seal(database_url, "--vacuum", "none")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert done["left"]["threads"] == 0 and done["sealed"]["threads"] >= 3
    for table in ("thread_checkpoints", "thread_blobs", "thread_writes"):
        assert sql(database_url, f"SELECT count(*) AS n FROM {table} WHERE thread_id = $1 AND leaf IS NULL",
                   thread)[0]["n"] == 0, table
    got = client.get(f"/v1/threads/{thread}/checkpoints/c0").json()
    assert base64.b64decode(got["checkpoint"]["data"]) == b"old checkpoint"
    assert [base64.b64decode(b["data"]) for b in got["blobs"]] == [b"old blob"]
    assert [base64.b64decode(w["data"]) for w in got["writes"]] == [b"old write"]
    gone = client.post("/v1/threads:delete_for_runs", json={"run_ids": [run]})  # found by the clear run_id
    assert gone.status_code == 200 and gone.json()["deleted_checkpoints"] == 1


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_a_row_a_writer_holds_is_skipped_reported_and_sealed_by_the_next_run(
    client: httpx.Client, database_url: str
) -> None:
    session_id, ids = run_script(client, [[user("Locked while sealing.")]], FAST)
    _in_the_clear_again(database_url, session_id)
    with HeldLock(database_url, "SELECT id FROM artifacts WHERE id = $1 FOR UPDATE", ids[0][0]):
        result, done = _seal(database_url, "--vacuum", "none")
        assert result.exit_code == 1  # never waits for the writer, and says what it left
        assert done["left"]["artifacts"] == 1 and done["vacuumed"] == []
        [held] = sql(database_url, "SELECT leaf FROM artifacts WHERE id = $1", ids[0][0])
        assert held["leaf"] is None
    result, done = _seal(database_url, "--vacuum", "none")
    assert result.exit_code == 0 and done["left"]["artifacts"] == 0
    assert sql(database_url, "SELECT count(*) AS n FROM artifacts WHERE session_id = $1 AND leaf IS NULL",
               session_id)[0]["n"] == 0
    assert artifacts(client, session_id)[1]["content"] == "Locked while sealing."


def test_bad_options_are_refused_before_anything_runs(database_url: str) -> None:
    env = {"LETHE_DATABASE_URL": database_url}
    result = CliRunner().invoke(cli, ["keys", "seal", "--vacuum", "sometimes"], env=env)
    assert result.exit_code == 2 and "plain, full or none" in result.output
    assert CliRunner().invoke(cli, ["keys", "seal", "--batch", "0"], env=env).exit_code == 2


def test_seal_takes_session_settings_conversations_sources_and_ended_jobs_reasons_from_before_0019_and_0021(
    client: httpx.Client, database_url: str, data_dir: Path
) -> None:
    marker = f"gnu{uuid.uuid4().hex[:10]}"
    r = client.post("/v1/sessions", json={"system_prompt": f"Prompt {marker}.", "sampling": FAST})
    assert r.status_code == 201, r.text
    session_id = r.json()["id"]
    turn = client.post(f"/v1/sessions/{session_id}/turns", json={"inputs": [
        {"type": "document", "content": "A page.", "source": f"https://{marker}.example"}], "generate": False})
    assert turn.status_code == 200, turn.text
    conv = client.post("/v1/conversations", json={"metadata": {"topic": marker}})
    assert conv.status_code == 200, conv.text
    job = forget(client, {"session_id": session_id, "text": "page"}, wait=True, reason=f"asked about {marker}")
    # Each as the versions before 0019 and 0021 stored it: in the clear, no leaf.
    sql(database_url, "UPDATE sessions SET system_prompt = $2, tools = '[]'::jsonb, settings_sealed = NULL, "
        "leaf = NULL WHERE id = $1", session_id, f"Prompt {marker}.")
    sql(database_url, "INSERT INTO env_snapshots (id, session_id, turn, state) VALUES ($1, $2, 0, $3::jsonb)",
        f"env_{uuid.uuid4().hex[:26]}", session_id, json.dumps({"note": marker}))
    sql(database_url, "UPDATE openai_conversations SET meta = $2::jsonb, meta_sealed = NULL, leaf = NULL "
        "WHERE id = $1", conv.json()["id"], json.dumps({"topic": marker}))
    sql(database_url, "UPDATE artifacts SET meta = meta || jsonb_build_object('source', $2::text), meta_sealed = NULL "
        "WHERE session_id = $1 AND kind = 'document'", session_id, f"https://{marker}.example")
    sql(database_url, "UPDATE forget_jobs SET reason = $2, reason_sealed = NULL, target_sealed = NULL, "
        "receipt_sealed = NULL, leaf = NULL WHERE id = $1", job["id"], f"asked about {marker}")

    result, done = _seal(database_url, "--vacuum", "full")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert not any(done["left"].values()), done
    for table in ("sessions", "env_snapshots", "openai_conversations", "forget_jobs"):
        assert done["sealed"][table] >= 1, (table, done)
    assert client.get(f"/v1/sessions/{session_id}").json()["system_prompt"] == f"Prompt {marker}."
    assert client.get(f"/v1/conversations/{conv.json()['id']}").json()["metadata"] == {"topic": marker}
    [document] = [a for a in artifacts(client, session_id) if a["kind"] == "document"]
    assert document["source"] == f"https://{marker}.example"
    [state] = [e["state"] for e in stored_environments(database_url, session_id) if e["turn"] == 0]
    assert state == {"note": marker}
    assert client.get(f"/v1/forget/{job['id']}").json()["reason"] is None  # an ended job's reason is dropped
    sql(database_url, "CHECKPOINT")
    assert files_holding(data_dir / "pg" / "base", [marker.encode()])[marker.encode()] == []
