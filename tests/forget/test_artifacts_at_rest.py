"""Session content at rest (issue 42, the artifacts slice; docs/erasure-at-rest.md): no plaintext text or token ids
of a turn in the database's files, a forget shreds the leaves of the artifacts it erased (their ciphertexts, in
every copy, stop opening) while survivors keep theirs, a punctured leaf under a live artifact (what a backup restored
from before a forget holds) lists as erased and never as a 5xx, and tenants' keys are apart.

Everything is real: the suite's embedded PostgreSQL and server, its local key store. SQL only looks at the tables;
a keyring built here is a fresh process's over the same key store, with nothing cached.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from app.keys.errors import Erased
from app.keys.keyring import Keyring
from app.sessions.repositories.sealing import binding
from tests.forget.forget_helpers import artifacts, forget, run_script, user, wait_job
from tests.support import files_holding, fresh_keyring, problem, sql, stored_artifacts

FAST = {"temperature": 0, "max_tokens": 4, "seed": 3}


def _opens(keyring: Keyring, row: dict[str, Any]) -> bool:
    try:
        asyncio.run(keyring.unseal(binding(row["tenant_id"], row["id"], "content"), row["content_sealed"]))
    except Erased:
        return False
    return True



def test_no_plaintext_text_or_token_ids_reach_the_database_files(
    client: httpx.Client, database_url: str, data_dir: Path
) -> None:
    marker = f"zebra{uuid.uuid4().hex[:12]}"
    session_id, ids = run_script(client, [[user(f"My locker code is {marker}.")]], FAST)
    [row] = stored_artifacts(database_url, "WHERE id = $1", ids[0][0])
    assert row["leaf"] is not None and row["content"] == f"My locker code is {marker}."
    raw = sql(database_url, "SELECT content, token_ids, embedding FROM artifacts WHERE session_id = $1", session_id)
    assert all(r["content"] is None and r["token_ids"] is None and r["embedding"] is None for r in raw)
    sql(database_url, "CHECKPOINT")  # heap pages to their files; the WAL holds every change already

    tokens = np.asarray(row["token_ids"], dtype="<i4").tobytes()
    found = files_holding(data_dir / "pg", [marker.encode(), tokens, ids[0][0].encode()])
    assert found[ids[0][0].encode()], "the scan does not see what the database wrote"  # ids are in the clear
    assert found[marker.encode()] == [] and found[tokens] == []


def test_a_forget_shreds_what_it_erased_and_survivors_keep_their_leaves(
    client: httpx.Client, database_url: str, live_server: Any
) -> None:
    session_id, ids = run_script(client, [[user("I keep bees.")], [user("My PIN is 8812.")], [user("Hi.")]], FAST)
    before = {r["id"]: r for r in stored_artifacts(database_url, "WHERE session_id = $1", session_id)}
    job = forget(client, {"artifact_id": ids[1][0]}, wait=True)
    assert job["status"] == "succeeded", job
    assert job["erasure"]["at_rest"] == "complete" and job["erasure"]["at_rest_complete_at"] is not None

    after = {r["id"]: r for r in stored_artifacts(database_url, "WHERE session_id = $1", session_id)}
    [recorded] = sql(database_url, "SELECT shred_leaves FROM forget_jobs WHERE id = $1", job["id"])
    shredded = set(recorded["shred_leaves"])
    survivors = {i for i, r in before.items() if i in after and after[i]["leaf"] == r["leaf"]}
    erased = set(before) - survivors
    assert ids[0][0] in survivors and ids[1][0] in erased  # turns before τ kept as they were
    assert shredded == {before[i]["leaf"] for i in erased}
    keyring = fresh_keyring(live_server)
    assert [i for i in erased if _opens(keyring, before[i])] == []  # every copy of those bytes is noise now
    assert all(_opens(keyring, before[i]) for i in survivors)
    assert not set(shredded) & {r["leaf"] for r in after.values()}  # replayed rows got fresh leaves
    listed = artifacts(client, session_id)
    assert "8812" not in str(listed) and any(a["content"] == "I keep bees." for a in listed)


def test_a_punctured_leaf_under_a_live_artifact_lists_as_erased(
    client: httpx.Client, database_url: str, live_server: Any
) -> None:
    """What a database restored from a backup taken before a forget holds: live artifacts whose leaf is punctured."""
    session_id, ids = run_script(client, [[user("My dog is Rex.")], [user("Hello.")]], FAST)
    [row] = stored_artifacts(database_url, "WHERE id = $1", ids[0][0])
    asyncio.run(fresh_keyring(live_server).shred(row["tenant_id"], [row["leaf"]]))
    # What the shred's notification does in the server's process.
    live_server.app.state.container.sealer.forget_cached(row["tenant_id"], [row["leaf"]])

    listed = client.get(f"/v1/sessions/{session_id}/artifacts")
    assert listed.status_code == 200, listed.text
    by_id = {a["id"]: a for a in listed.json()["artifacts"]}
    assert by_id[ids[0][0]]["erased"] is True and by_id[ids[0][0]]["content"] is None
    assert by_id[ids[1][0]]["erased"] is False and by_id[ids[1][0]]["content"] == "Hello."


def test_tenants_artifacts_are_sealed_apart(
    client: httpx.Client, other_tenant: httpx.Client, database_url: str, live_server: Any
) -> None:
    _, my_ids = run_script(client, [[user("Mine: blue.")]], FAST)
    theirs, their_ids = run_script(other_tenant, [[user("Theirs: red.")]], FAST)
    [a] = stored_artifacts(database_url, "WHERE id = $1", my_ids[0][0])
    [b] = stored_artifacts(database_url, "WHERE id = $1", their_ids[0][0])
    assert a["tenant_id"] != b["tenant_id"] and (a["content"], b["content"]) == ("Mine: blue.", "Theirs: red.")
    # A ciphertext moved under the other tenant's name does not open there.
    moved = {**a, "tenant_id": b["tenant_id"]}
    with pytest.raises(Exception) as raised:
        _opens(fresh_keyring(live_server), moved)
    assert not isinstance(raised.value, AssertionError)
    job = forget(client, {"artifact_id": my_ids[0][0]}, wait=True)
    assert job["status"] == "succeeded" and job["erasure"]["at_rest"] == "complete"
    assert _opens(fresh_keyring(live_server), b)
    assert any(x["content"] == "Theirs: red." for x in artifacts(other_tenant, theirs))


def test_a_forget_that_asks_to_shred_now_is_refused_while_the_provider_is_down(
    client: httpx.Client, database_url: str, tmp_path: Path, override_service: Any
) -> None:
    from app.forget.endpoints import get_forget

    session_id, ids = run_script(client, [[user("My PIN is 4471.")], [user("Hi.")]], FAST)
    blocked = tmp_path / "keys-down"
    blocked.write_text("not a directory")
    override_service(get_forget, "forget", key_dir=blocked)
    body = {"target": {"artifact_id": ids[0][0]}, "shred": "now"}
    refused = client.post("/v1/forget", json=body)
    assert problem(refused, 503)["type"].endswith("keys-unavailable") and int(refused.headers["Retry-After"]) > 0
    queued = sql(database_url, "SELECT count(*) AS n FROM forget_jobs WHERE target->>'artifact_id' = $1", ids[0][0])
    assert queued[0]["n"] == 0  # nothing queued
    problem(client.post("/v1/forget", json={**body, "shred": "later"}), 422)
    assert "4471" in str(artifacts(client, session_id))


def test_a_forget_that_asks_to_shred_now_ends_only_once_its_keys_are_destroyed(
    client: httpx.Client, database_url: str, live_server: Any
) -> None:
    """The key provider refuses the shred at the job's end (every other step done): the job does not read as
    succeeded, and runs its end again until the shred lands; then it ends `at_rest: complete`. A job without
    `shred: now` would have ended with its shred pending (test_memory_at_rest.py)."""
    import threading

    from app.keys.errors import Unavailable

    session_id, ids = run_script(client, [[user("My PIN is 5590.")], [user("Hi.")]], FAST)
    keyring = live_server.app.state.container.sealer.keyring
    shred, refusals, refused = keyring.shred, [], threading.Event()

    async def refusing(tenant: str, leaves: Any) -> None:
        refusals.append(len(list(leaves)))
        refused.set()
        raise Unavailable("the key provider is down")

    keyring.shred = refusing
    try:
        job = forget(client, {"artifact_id": ids[0][0]}, shred="now")
        assert refused.wait(240), "the job never reached its shred"
        while len(refusals) < 3:  # refused again and again: the job's end retries it (and the worker's sweep)
            refused.clear()
            assert refused.wait(240), "the shred was not retried"
        [row] = sql(database_url, "SELECT status, shred_now, shredded_at FROM forget_jobs WHERE id = $1", job["id"])
        assert row["status"] in ("queued", "running") and row["shred_now"] and row["shredded_at"] is None, row
        assert "5590" not in str(artifacts(client, session_id))  # the live erasure is done
    finally:
        keyring.shred = shred
    done = wait_job(client, job["id"])
    assert done["status"] == "succeeded" and done["erasure"]["at_rest"] == "complete", done
