"""Forget jobs' targets and reasons at rest (issue 42, the forget-jobs slice; docs/erasure-at-rest.md): the words a
forget names and its reason reach PostgreSQL only as ciphertext under the job's own leaf; while the job lives its
views show them, and once it ends the leaf is shredded with the job's others and its views show `target_erased`. A
ciphertext moved to another job does not open (loud, never erased); a detector webhook's forget is sealed the same
way; bad input and the key provider down store nothing.

Everything is real: the suite's embedded PostgreSQL and server, its local key store, the tiny model. A job is kept
live by holding its session's lease as another process would (`held_session`): its worker requeues it until the
block ends. SQL only looks at and moves bytes; a keyring built here is a fresh process's over the same key store.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.db.database import Database
from app.forget.repositories.sealing import SEALED_COLUMNS, binding
from app.keys.content import Sealer
from app.keys.errors import Erased, Tampered
from app.keys.factory import build_keyring, build_provider
from app.keys.keyring import Keyring
from app.keys.verify import verify
from tests.forget.forget_helpers import run_script, user, wait_job
from tests.forget.test_forget_tools import copy
from tests.forget.test_forget_tools import session as tool_session
from tests.forget.test_webhook import headers
from tests.support import BOOTSTRAP_KEY, files_holding, fresh_keyring, held_session, problem, sql

FAST = {"temperature": 0, "max_tokens": 4, "seed": 3}


def _unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


def _row(database_url: str, job_id: str) -> dict[str, Any]:
    [row] = sql(database_url, "SELECT * FROM forget_jobs WHERE id = $1", job_id)
    return {**dict(row), "target": json.loads(row["target"])}


def _unseal(keyring: Keyring, tenant_id: str, job_id: str, column: str, ciphertext: bytes) -> bytes:
    return asyncio.run(keyring.unseal(binding(tenant_id, job_id, column), ciphertext))


def _submit(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    answer = client.post("/v1/forget", json=body)
    assert answer.status_code == 202, answer.text
    job: dict[str, Any] = answer.json()
    return job


def _jobs(database_url: str) -> int:
    return int(sql(database_url, "SELECT count(*) AS n FROM forget_jobs")[0]["n"])


@pytest.fixture(scope="module")
def told(live_server: Any, data_dir: Path) -> Iterator[dict[str, Any]]:
    """One session told a secret (and two more words), its client, and a secret reason: what every test reads."""
    auth = {"Authorization": f"Bearer {BOOTSTRAP_KEY}"}  # the suite's tenant, as the `client` fixture's
    with httpx.Client(base_url=live_server.base_url, headers=auth, timeout=120) as client:
        secret, why = _unique("okapi"), _unique("gdpr-ticket-")
        session_id, _ = run_script(client, [[user(f"My vault code is {secret}.")], [user("Thanks.")]], FAST)
        yield {"client": client, "secret": secret, "why": why, "session_id": session_id}


def test_a_live_job_holds_only_ciphertext_and_its_end_shreds_it(
    told: dict[str, Any], database_url: str, data_dir: Path, live_server: Any
) -> None:
    client, secret, why, session_id = told["client"], told["secret"], told["why"], told["session_id"]
    # A job no worker claims (a plan waiting for its confirmation), to move a ciphertext into.
    planned = client.post(f"/v1/sessions/{session_id}/turns", json={"inputs": [user("Delete message 2")]})
    assert planned.status_code == 200, planned.text
    plan_id = planned.json()["forget_plan"]["id"]
    with held_session(database_url, session_id):
        job = _submit(client, {"target": {"session_id": session_id, "text": secret}, "reason": why})
        row = _row(database_url, job["id"])
        tenant_id = row["tenant_id"]
        # In the clear: ids and the words' length only; the words and the reason are ciphertext under the job's leaf.
        assert row["target"] == {"session_id": session_id, "text": None, "text_length": len(secret)}
        assert row["reason"] is None and row["leaf"] is not None
        assert row["target_sealed"] is not None and row["reason_sealed"] is not None
        keyring = fresh_keyring(live_server)
        assert json.loads(_unseal(keyring, tenant_id, job["id"], "target", row["target_sealed"])) == {
            "session_id": session_id, "text": secret}
        assert _unseal(keyring, tenant_id, job["id"], "reason", row["reason_sealed"]) == why.encode()
        live = client.get(f"/v1/forget/{job['id']}").json()  # while it lives, its views open them
        assert live["status"] in ("queued", "running") and live["target_erased"] is False
        assert live["target"] == {"session_id": session_id, "text": secret} and live["reason"] == why
        listed = client.get("/v1/forget", params={"session_id": session_id}).json()["jobs"]
        assert {j["id"]: j["reason"] for j in listed}[job["id"]] == why  # the session filter still finds it

        # (c) A ciphertext moved to another job's row does not open there: loud (a 500), never "erased".
        own = _row(database_url, plan_id)["reason_sealed"]
        assert own is not None and client.get(f"/v1/forget/{plan_id}").json()["reason"] == "requested in the session"
        sql(database_url, "UPDATE forget_jobs SET reason_sealed = $2 WHERE id = $1", plan_id, row["reason_sealed"])
        try:
            with pytest.raises(Tampered):
                _unseal(keyring, tenant_id, plan_id, "reason", row["reason_sealed"])
            assert client.get(f"/v1/forget/{plan_id}").status_code == 500
            report = asyncio.run(_verify(live_server, database_url, tenant_id))
            assert report.tables[0].counts["tampered"] == 1 and report.tables[0].counts["ok"] >= 2
            assert any(plan_id in where for where in report.tables[0].examples["tampered"])
        finally:
            sql(database_url, "UPDATE forget_jobs SET reason_sealed = $2 WHERE id = $1", plan_id, own)
        assert client.get(f"/v1/forget/{plan_id}").json()["reason"] == "requested in the session"

    done = wait_job(client, job["id"])
    assert done["status"] == "succeeded", done
    # (b) Ended: the target shows ids and the length only, the reason is gone, the receipt is whole.
    assert done["target_erased"] is True and done["reason"] is None
    assert done["target"] == {"session_id": session_id, "text": None, "text_length": len(secret)}
    assert done["sessions"] and done["sessions"][0]["session_id"] == session_id
    assert done["erasure"]["live"] == "complete" and done["erasure"]["at_rest"] == "complete"
    ended = _row(database_url, job["id"])
    assert ended["target_sealed"] is None and ended["reason_sealed"] is None
    assert row["leaf"] in ended["shred_leaves"] and ended["shredded_at"] is not None
    after = fresh_keyring(live_server)  # every copy of the bytes it held while live (backups, WAL) is noise now
    for column in ("target", "reason"):
        with pytest.raises(Erased):
            _unseal(after, tenant_id, job["id"], column, row[f"{column}_sealed"])
    listed = client.get("/v1/forget", params={"session_id": session_id}).json()["jobs"]
    assert {j["id"]: j["target_erased"] for j in listed}[job["id"]] is True

    # (a) Neither the words nor the reason ever reached the database's files; the job's id did.
    sql(database_url, "CHECKPOINT")
    found = files_holding(data_dir / "pg", [secret.encode(), why.encode(), job["id"].encode()])
    assert found[job["id"].encode()], "the scan does not see what the database wrote"
    assert found[secret.encode()] == [] and found[why.encode()] == []


async def _verify(live_server: Any, database_url: str, tenant_id: str) -> Any:
    """`lethe keys verify` over the forget jobs' declared sealed columns."""
    db = Database(database_url, pool_size=1)
    try:
        provider = build_provider(live_server.app.state.container.settings)
        return await verify(db, Keyring(provider, creates=False), SEALED_COLUMNS, tenant=tenant_id)
    finally:
        await db.close()


def test_a_detector_webhook_forget_is_sealed_too(
    told: dict[str, Any], anon: httpx.Client, database_url: str, data_dir: Path, live_server: Any
) -> None:
    client = told["client"]
    span, detector = _unique("wire-to-"), _unique("det-")
    session_id, ids = run_script(client, [[user(f"Page: sunny. {span} now.")]], FAST)
    body = json.dumps({"session_id": session_id, "artifact_id": ids[0][0], "text": span, "detector": detector,
                       "score": 0.9}).encode()
    with held_session(database_url, session_id):
        accepted = anon.post("/v1/webhooks/detector", content=body, headers=headers(_unique("msg_"), body))
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["forget_id"]
        row = _row(database_url, job_id)
        assert row["target"] == {"session_id": session_id, "text": None, "text_length": len(span)}
        assert row["reason"] is None and row["target_sealed"] is not None and row["reason_sealed"] is not None
        live = client.get(f"/v1/forget/{job_id}").json()
        assert live["target"]["text"] == span and live["reason"] == f"detector {detector} (score 0.900)"
    done = wait_job(client, job_id)
    assert done["status"] == "succeeded" and done["target_erased"] is True and done["reason"] is None
    assert row["leaf"] in _row(database_url, job_id)["shred_leaves"]
    with pytest.raises(Erased):
        _unseal(fresh_keyring(live_server), row["tenant_id"], job_id, "reason", row["reason_sealed"])
    sql(database_url, "CHECKPOINT")
    found = files_holding(data_dir / "pg", [span.encode(), detector.encode()])
    assert found == {span.encode(): [], detector.encode(): []}


def test_a_job_waiting_on_its_client_keeps_the_call_and_the_answer_sealed(
    told: dict[str, Any], database_url: str, data_dir: Path, live_server: Any
) -> None:
    """A replay that makes a client call anew waits for the client (needs_input): the call (its arguments) and the
    client's answer are content, held only in `receipt_sealed` under the job's leaf (test_forget_tools runs the
    flow itself)."""
    client, answer = told["client"], _unique("Bob-is-at-")
    session_id, _ = tool_session(client, [[copy("lookup_contact", {"name": "Bob"})]])
    call = client.get(f"/v1/sessions/{session_id}").json()["pending_tool_calls"][0]
    r = client.post(f"/v1/sessions/{session_id}/turns", json={
        "inputs": [{"type": "tool_result", "tool_call_id": call["id"], "content": "Bob: DE11 2222"}]})
    assert r.status_code == 200, r.text
    job = wait_job(client, _submit(client, {"target": {"session_id": session_id, "text": "Bob"}})["id"])
    assert job["status"] == "needs_input", job
    waiting = _row(database_url, job["id"])
    receipt = json.loads(waiting["receipt"])
    assert "pending" not in receipt and "inputs" not in receipt and waiting["receipt_sealed"] is not None
    pending = job["pending"]["tool_call"]  # opened for its client
    given = client.post(f"/v1/forget/{job['id']}/tool_results", json={"tool_call_id": pending["id"], "content": answer})
    assert given.status_code == 200 and given.json()["status"] == "queued", given.text
    assert answer not in _row(database_url, job["id"])["receipt"]
    done = wait_job(client, job["id"])
    assert done["status"] == "succeeded" and done["target_erased"] is True and done["pending"] is None, done
    ended = _row(database_url, job["id"])
    assert ended["receipt_sealed"] is None and waiting["leaf"] in ended["shred_leaves"]
    with pytest.raises(Erased):
        _unseal(fresh_keyring(live_server), waiting["tenant_id"], job["id"], "receipt", waiting["receipt_sealed"])
    sql(database_url, "CHECKPOINT")
    assert files_holding(data_dir / "pg", [answer.encode()]) == {answer.encode(): []}


def test_bad_input_is_422_and_stores_nothing(
    told: dict[str, Any], anon: httpx.Client, database_url: str
) -> None:
    client, marker = told["client"], _unique("never-stored-")
    before = _jobs(database_url)
    problem(client.post("/v1/forget", json={"target": {"text": marker}, "reason": marker}), 422)  # no session_id
    problem(client.post("/v1/forget", json={"target": {"session_id": told["session_id"], "text": marker},
                                            "reason": "x" * 2001}), 422)
    body = json.dumps({"session_id": told["session_id"], "text": f"{marker}\u0000", "detector": "d"}).encode()
    problem(anon.post("/v1/webhooks/detector", content=body, headers=headers(_unique("msg_"), body)), 422)
    assert _jobs(database_url) == before


def test_the_key_provider_down_answers_503_and_stores_nothing(
    told: dict[str, Any], database_url: str, live_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process's key store unreachable, nothing cached: a job holding words to seal is refused before any row."""
    container = live_server.app.state.container
    blocked = tmp_path / "keys-down"
    blocked.write_text("not a directory")
    down = Sealer(build_keyring(container.settings.model_copy(update={"key_dir": blocked})), container.sealer.leaves)
    marker, before = _unique("unsealable-"), _jobs(database_url)
    monkeypatch.setattr(container.services.forget, "sealer", down)
    answer = told["client"].post("/v1/forget", json={
        "target": {"session_id": told["session_id"], "query": marker}, "reason": marker,
    })
    assert problem(answer, 503)["type"].endswith("keys-unavailable") and int(answer.headers["Retry-After"]) > 0
    assert _jobs(database_url) == before
