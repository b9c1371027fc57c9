"""Memory injection and the forget cascade: a session injects its namespace's live records at start; forgetting a
record (DELETE /v1/memory/... or POST /v1/forget with a memory target) replays every session it was injected into,
so the value is in none of them afterwards, and the sessions equal ones started without it."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import httpx

from tests.forget.forget_helpers import artifacts, assert_tiles, forget, run_script, shape, tables_holding, wait_job

FAST = {"temperature": 0, "max_tokens": 16, "seed": 3}
HOME = "The user lives at 4 Elm Street, Springfield."
PET = "The user has a cat named Tom."


def put(client: httpx.Client, ns: str, key: str, value: Any) -> None:
    r = client.put(f"/v1/memory/{ns}/{key}", json={"value": value, "source": "user"}, headers={"If-None-Match": "*"})
    assert r.status_code in (200, 201), r.text


def namespace(client: httpx.Client, **records: Any) -> str:
    ns = "user-" + uuid.uuid4().hex[:8]
    for key, value in records.items():
        put(client, ns, key, value)
    return ns


def test_live_records_are_injected_at_session_start(client: httpx.Client) -> None:
    ns = namespace(client, home=HOME, pet=PET, prefs={"diet": "vegan"})
    client.delete(f"/v1/memory/{ns}/prefs")
    session_id, _ = run_script(client, [[{"type": "user", "content": "Hi"}]], FAST, memory_namespace=ns)
    items = artifacts(client, session_id)
    memories = [a for a in items if a["kind"] == "memory"]
    assert [(m["content"], m["memory"]["key"], m["memory"]["version"], m["turn"]) for m in memories] == [
        (HOME, "home", 1, 0), (PET, "pet", 1, 0)
    ]
    assert items[0]["kind"] == "system" and all(m["source_ids"] == [m["id"]] for m in memories)
    assert_tiles(items)
    # a JSON value is injected as JSON
    ns2 = namespace(client, prefs={"diet": "vegan"})
    sid2, _ = run_script(client, [], FAST, memory_namespace=ns2)
    assert [a["content"] for a in artifacts(client, sid2) if a["kind"] == "memory"] == ['{"diet": "vegan"}']


def test_forgetting_a_record_replays_every_session_it_reached(client: httpx.Client, database_url: str) -> None:
    street = f"{uuid.uuid4().int % 10_000} Elm Street"  # unique in the database, so the search below is this test's
    ns = namespace(client, home=f"The user lives at {street}, Springfield.", pet=PET)
    script = [[{"type": "user", "content": "Where do I live?"}], [{"type": "user", "content": "And my pet?"}]]
    sessions = [run_script(client, script, FAST, memory_namespace=ns)[0] for _ in range(2)]
    unrelated, _ = run_script(client, script, FAST, memory_namespace=namespace(client, home="Somewhere else"))
    before_unrelated = artifacts(client, unrelated)

    r = client.delete(f"/v1/memory/{ns}/home")
    assert r.status_code == 200, r.text
    job = wait_job(client, r.json()["forget_id"])
    assert job["status"] == "succeeded", job
    assert {s["session_id"] for s in job["sessions"]} == set(sessions)
    assert job["memory"] == {"namespace": ns, "key": "home", "tombstone_version": 2}
    assert all(s["tau"] == 0 for s in job["sessions"])

    reference, _ = run_script(client, script, FAST, memory_namespace=namespace(client, pet=PET))
    for session_id in sessions:
        after = artifacts(client, session_id)
        assert not [a for a in after if "Elm Street" in a["content"]]
        assert [a["content"] for a in after if a["kind"] == "memory"] == [PET]
        assert shape(after, database_url) == shape(artifacts(client, reference), database_url)
    assert artifacts(client, unrelated) == before_unrelated
    assert not tables_holding(database_url, street)


def test_forget_endpoint_with_a_memory_target_tombstones_and_cascades(client: httpx.Client) -> None:
    ns = namespace(client, home=HOME)
    session_id, _ = run_script(client, [[{"type": "user", "content": "Where do I live?"}]], FAST, memory_namespace=ns)
    plan = forget(client, {"memory": {"namespace": ns, "key": "home"}}, dry_run=True)
    assert [s["session_id"] for s in plan["sessions"]] == [session_id]
    assert client.get(f"/v1/memory/{ns}/home").status_code == 200  # a plan changes nothing
    job = forget(client, {"memory": {"namespace": ns, "key": "home"}}, wait=True)
    assert job["status"] == "succeeded", job
    assert client.get(f"/v1/memory/{ns}/home").json()["forgotten"] is True
    assert not [a for a in artifacts(client, session_id) if a["kind"] == "memory"]


def test_sessions_created_while_a_record_is_forgotten_never_keep_it(client: httpx.Client) -> None:
    """The record rows are read FOR SHARE by a session's creation: a creation racing the tombstone either commits
    first (and the cascade replays it) or reads the tombstone (and injects nothing)."""
    ns = namespace(client, home=HOME)
    created: list[str] = []

    def create_sessions() -> None:
        for _ in range(6):
            r = client.post("/v1/sessions", json={"memory_namespace": ns, "sampling": FAST})
            assert r.status_code == 201, r.text
            created.append(r.json()["id"])

    thread = threading.Thread(target=create_sessions)
    thread.start()
    r = client.delete(f"/v1/memory/{ns}/home")
    thread.join()
    assert wait_job(client, r.json()["forget_id"])["status"] == "succeeded"
    for session_id in created:
        assert not [a for a in artifacts(client, session_id) if "Elm Street" in a["content"]], session_id
