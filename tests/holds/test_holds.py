"""Legal holds (issue 43; docs/subjects.md, "Legal holds"): while a hold stands, every erasure of what it covers
answers 409 `legal_hold` naming it, a subject's erasure skips the held part and says so, and releasing the hold runs
the erasure it deferred. Holds are audited (which key, when). A hold placed while an erasure of the same session is
in flight is ordered against it: both orders are forced with a row lock, never a sleep.

Against the run's real server, PostgreSQL and tiny model.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import httpx
import pytest

from tests.forget.forget_helpers import artifacts, run_script, user, wait_job
from tests.support import HeldLock, problem, sql, until

FAST = {"temperature": 0, "max_tokens": 4, "seed": 3}


def _subject() -> str:
    return "held-" + uuid.uuid4().hex[:10]


def _hold(client: httpx.Client, **scope: str) -> dict[str, Any]:
    r = client.post("/v1/holds", json={**scope, "reason": "litigation 2026-114"})
    assert r.status_code == 201, r.text
    hold: dict[str, Any] = r.json()
    assert hold["id"].startswith("hld_") and hold["released_at"] is None
    assert hold["created_by"] is not None and [e["action"] for e in hold["events"]] == ["placed"]
    return hold


def _refused(response: httpx.Response, hold_id: str) -> None:
    body = problem(response, 409)
    assert body["type"].endswith("legal_hold") and body["hold_id"] == hold_id, body


def _put_memory(client: httpx.Client, ns: str, key: str, value: Any) -> None:
    r = client.put(f"/v1/memory/{ns}/{key}", json={"value": value, "source": "user"}, headers={"If-None-Match": "*"})
    assert r.status_code == 201, r.text


def test_held_parts_survive_every_erasure_and_the_release_erases_them(client: httpx.Client) -> None:
    alice = _subject()
    ns = "held-" + uuid.uuid4().hex[:8]
    kept, ids = run_script(client, [[user("Alice's contract, clause 7.")]], FAST, subject_id=alice)
    gone, _ = run_script(client, [[user("Alice likes tea.")]], FAST, subject_id=alice)
    _put_memory(client, ns, "case", {"file": "2026-114"})
    assert client.put(f"/v1/subjects/{alice}", json={"memory_namespaces": [ns]}).status_code == 200
    on_session, on_namespace = _hold(client, session_id=kept), _hold(client, namespace=ns)

    # Every erasure of a held part: refused, naming the hold; nothing changed.
    _refused(client.delete(f"/v1/sessions/{kept}"), on_session["id"])
    _refused(client.post("/v1/forget", json={"target": {"artifact_id": ids[0][0]}}), on_session["id"])
    _refused(client.post("/v1/forget", json={"target": {"session_id": kept, "text": "clause 7"}}), on_session["id"])
    _refused(client.delete(f"/v1/memory/{ns}/case"), on_namespace["id"])
    # A dry run is not an erasure: it answers, and says what is held.
    assert client.post("/v1/forget", json={"target": {"artifact_id": ids[0][0]}, "dry_run": True}).status_code == 200

    plan = client.post(f"/v1/subjects/{alice}/erase", json={"dry_run": True}).json()
    assert plan["sessions"] == [gone] and plan["memory_keys"] == 0
    assert plan["held"] == [{"hold_id": on_session["id"], "session_id": kept},
                            {"hold_id": on_namespace["id"], "namespace": ns}]
    erased = client.post(f"/v1/subjects/{alice}/erase", json={})
    assert erased.status_code == 200, erased.text
    receipt = erased.json()["subject"]
    assert receipt["sessions"] == [gone] and receipt["namespaces"] == [] and receipt["memory_keys"] == 0
    assert receipt["held"] == plan["held"]
    problem(client.get(f"/v1/sessions/{gone}"), 404)
    assert client.get(f"/v1/sessions/{kept}").status_code == 200
    assert client.get(f"/v1/memory/{ns}/case").json()["value"] == {"file": "2026-114"}

    audit = client.get(f"/v1/holds/{on_session['id']}").json()
    assert audit["deferred"] == [alice]
    assert [e["action"] for e in audit["events"]] == ["placed", "deferred"]
    assert audit["events"][1]["detail"] == {"subject_id": alice, "forget_id": erased.json()["id"]}

    # Release one hold: its part is erased now; the part the other still holds waits on that one.
    released = client.delete(f"/v1/holds/{on_session['id']}")
    assert released.status_code == 200, released.text
    assert released.json()["released_at"] is not None and released.json()["released_by"] == audit["created_by"]
    [rerun] = released.json()["erasures"]
    assert released.json()["deferred"] == []
    assert wait_job(client, rerun)["subject"]["sessions"] == [kept]  # queued by the release, run by the worker
    problem(client.get(f"/v1/sessions/{kept}"), 404)
    assert client.get(f"/v1/memory/{ns}/case").status_code == 200
    assert client.get(f"/v1/holds/{on_namespace['id']}").json()["deferred"] == [alice]

    last = client.delete(f"/v1/holds/{on_namespace['id']}").json()
    assert len(last["erasures"]) == 1 and [e["action"] for e in last["events"]][-1] == "released"
    assert wait_job(client, last["erasures"][0])["status"] == "succeeded"
    gone_key = client.get(f"/v1/memory/{ns}/case")
    assert gone_key.status_code == 404 and gone_key.json().get("forgotten") is True
    again = client.delete(f"/v1/holds/{on_namespace['id']}")  # a release again runs nothing and changes nothing
    assert again.status_code == 200 and again.json()["erasures"] == []
    assert again.json()["released_at"] == last["released_at"]


def test_a_hold_on_the_subject_refuses_its_erasure_and_the_deletion_of_their_sessions(
    client: httpx.Client,
) -> None:
    bob, other = _subject(), _subject()
    session, _ = run_script(client, [[user("Bob's claim.")]], FAST, subject_id=bob)
    conv = client.post("/v1/conversations", json={"metadata": {"lethe_subject_id": bob}})
    unrelated, _ = run_script(client, [[user("Someone else.")]], FAST, subject_id=other)
    hold = _hold(client, subject_id=bob)

    _refused(client.post(f"/v1/subjects/{bob}/erase", json={}), hold["id"])
    _refused(client.delete(f"/v1/sessions/{session}"), hold["id"])
    refused = client.delete(f"/v1/conversations/{conv.json()['id']}")  # OpenAI's error shape, the same status
    assert refused.status_code == 409, refused.text
    assert client.get(f"/v1/subjects/{bob}").json()["sessions"] == 2
    assert client.delete(f"/v1/sessions/{unrelated}").status_code == 204  # others are not held

    assert client.delete(f"/v1/holds/{hold['id']}").json()["erasures"] == []  # nothing was deferred: it was refused
    assert client.post(f"/v1/subjects/{bob}/erase", json={}).status_code == 200
    problem(client.get(f"/v1/sessions/{session}"), 404)


def test_a_hold_may_come_before_the_data(client: httpx.Client) -> None:
    carol = _subject()
    hold = _hold(client, subject_id=carol)  # the subject is made by the hold
    assert client.get(f"/v1/subjects/{carol}").json()["sessions"] == 0
    session, _ = run_script(client, [[user("Carol's first message.")]], FAST, subject_id=carol)
    _refused(client.delete(f"/v1/sessions/{session}"), hold["id"])


def test_bad_input_and_other_tenants(client: httpx.Client, other_tenant: httpx.Client) -> None:
    session = client.post("/v1/sessions", json={}).json()["id"]
    for body in ({"reason": "x"}, {"session_id": session, "namespace": "n", "reason": "x"},
                 {"session_id": session}, {"session_id": session, "reason": ""},
                 {"session_id": session, "reason": "x" * 2001}, {"subject_id": "-bad", "reason": "x"},
                 {"namespace": "bad/ns", "reason": "x"}, {"session_id": session, "reason": "x", "extra": 1}):
        problem(client.post("/v1/holds", json=body), 422)
    problem(client.post("/v1/holds", json={"session_id": "ses_" + "0" * 26, "reason": "x"}), 404)
    problem(other_tenant.post("/v1/holds", json={"session_id": session, "reason": "x"}), 404)
    hold = _hold(client, session_id=session)
    problem(other_tenant.get(f"/v1/holds/{hold['id']}"), 404)
    problem(other_tenant.delete(f"/v1/holds/{hold['id']}"), 404)
    problem(other_tenant.delete(f"/v1/sessions/{session}"), 404)
    for missing in ("hld_" + "0" * 26, "nope"):
        problem(client.get(f"/v1/holds/{missing}"), 404)
        problem(client.delete(f"/v1/holds/{missing}"), 404)
    assert client.get(f"/v1/holds/{hold['id']}").json()["released_at"] is None  # nothing above touched it


def _advisory_waiters(database_url: str) -> int:
    rows = sql(database_url, "SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event = 'advisory'")
    return int(rows[0]["n"])


@pytest.mark.parametrize("first", ["hold", "erase"])
def test_a_hold_and_a_deletion_of_the_same_session_are_ordered(
    client: httpx.Client, database_url: str, first: str
) -> None:
    """The one that first takes the session's hold lock wins, the other sees its outcome: never a deleted session
    under a hold. Parked with a lock on the tenant's row (inserting a hold or a deletion's job takes its key share
    lock), the first is provably inside its transaction, holding the scope, when the second starts."""
    session = client.post("/v1/sessions", json={"system_prompt": "held or gone"}).json()["id"]
    [owner] = sql(database_url, "SELECT tenant_id FROM sessions WHERE id = $1", session)
    answers: dict[str, httpx.Response] = {}

    def send(name: str, method: str, path: str, **kwargs: Any) -> threading.Thread:
        def call() -> None:
            with httpx.Client(base_url=str(client.base_url), headers=dict(client.headers), timeout=300) as own:
                answers[name] = own.request(method, path, **kwargs)

        thread = threading.Thread(target=call)
        thread.start()
        return thread

    hold_body = {"json": {"session_id": session, "reason": "ordered"}}
    with HeldLock(database_url, "SELECT id FROM tenants WHERE id = $1 FOR UPDATE", owner["tenant_id"]) as lock:
        if first == "hold":
            threads = [send("hold", "POST", "/v1/holds", **hold_body)]
            lock.wait_blocked(1)  # the hold's insert: it holds the scope's exclusive lock
            threads.append(send("erase", "DELETE", f"/v1/sessions/{session}"))
        else:
            threads = [send("erase", "DELETE", f"/v1/sessions/{session}")]
            lock.wait_blocked(1)  # the deletion's job insert: it holds the scope's shared lock, past its check
            threads.append(send("hold", "POST", "/v1/holds", **hold_body))
        until(lambda: _advisory_waiters(database_url) >= 1, "the second request waits for the scope's lock")
    for thread in threads:
        thread.join()
    if first == "hold":
        assert answers["hold"].status_code == 201, answers["hold"].text
        _refused(answers["erase"], answers["hold"].json()["id"])
        assert client.get(f"/v1/sessions/{session}").status_code == 200
    else:
        assert answers["erase"].status_code == 204, answers["erase"].text
        problem(answers["hold"], 404)
        problem(client.get(f"/v1/sessions/{session}"), 404)


def test_also_skips_another_subjects_session_their_hold_covers(client: httpx.Client) -> None:
    alice, bob = _subject(), _subject()
    marker = "heron-" + uuid.uuid4().hex[:6]
    bobs, _ = run_script(client, [[user(f"Alice told me {marker}.")]], FAST, subject_id=bob)
    assert client.put(f"/v1/subjects/{alice}", json={"memory_namespaces": []}).status_code == 201
    hold = _hold(client, subject_id=bob)  # on bob: his sessions are held, alice's erasure must not replay them
    body = {"also": {"text": [marker]}}
    plan = client.post(f"/v1/subjects/{alice}/erase", json={**body, "dry_run": True}).json()
    assert plan["also"] == [] and plan["held"] == [{"hold_id": hold["id"], "session_id": bobs}]
    erased = client.post(f"/v1/subjects/{alice}/erase", json=body).json()["subject"]
    assert erased["also"] == [] and erased["held"] == plan["held"]
    assert any(marker in (a.get("content") or "") for a in artifacts(client, bobs))
    assert client.get(f"/v1/holds/{hold['id']}").json()["deferred"] == [alice]


def test_a_memory_forgets_cascade_waits_on_a_held_session_and_runs_on_release(client: httpx.Client) -> None:
    """The namespace is not held, so the key is forgotten (tombstoned, shredded); the session it was injected into
    is held, so the cascade's replay of it waits on the hold, and the hold's release runs it."""
    street = f"{uuid.uuid4().int % 10_000} Birch Lane"
    ns = "held-" + uuid.uuid4().hex[:8]
    _put_memory(client, ns, "home", f"The user lives at {street}.")
    script = [[user("Where do I live?")]]
    held_session, _ = run_script(client, script, FAST, memory_namespace=ns)
    free_session, _ = run_script(client, script, FAST, memory_namespace=ns)
    hold = _hold(client, session_id=held_session)

    deleted = client.delete(f"/v1/memory/{ns}/home")
    assert deleted.status_code == 200, deleted.text
    job = wait_job(client, deleted.json()["forget_id"])
    assert job["status"] == "held" and job["hold_id"] == hold["id"], job
    assert [s["session_id"] for s in job["sessions"]] == [free_session]  # the others went on
    assert job["erasure"]["live"] == "pending"
    assert not any(street in (a.get("content") or "") for a in artifacts(client, free_session))
    assert any(street in (a.get("content") or "") for a in artifacts(client, held_session))
    assert client.get(f"/v1/memory/{ns}/home").json().get("forgotten") is True
    audit = client.get(f"/v1/holds/{hold['id']}").json()
    assert audit["jobs"] == [job["id"]]
    assert audit["events"][-1]["action"] == "deferred"
    assert audit["events"][-1]["detail"] == {"forget_id": job["id"], "session_id": held_session}
    assert job["id"] in [j["id"] for j in client.get("/v1/forget", params={"status": "held"}).json()["jobs"]]

    released = client.delete(f"/v1/holds/{hold['id']}").json()
    assert released["erasures"] == [job["id"]] and released["jobs"] == []
    done = wait_job(client, job["id"])
    assert done["status"] == "succeeded" and done["hold_id"] is None, done
    assert {s["session_id"] for s in done["sessions"]} == {free_session, held_session}
    assert not any(street in (a.get("content") or "") for a in artifacts(client, held_session))


def test_a_forget_queued_before_the_hold_waits_on_it(client: httpx.Client, database_url: str) -> None:
    """The job is queued and claimed before the hold exists; parked (a row lock on its session, which its lease must
    write) until the hold is placed, it must find the hold in the transaction that would swap the session, and wait."""
    marker = "osprey-" + uuid.uuid4().hex[:6]
    session, _ = run_script(client, [[user(f"My locker code is {marker}.")], [user("Thanks.")]], FAST)
    with HeldLock(database_url, "SELECT id FROM sessions WHERE id = $1 FOR NO KEY UPDATE", session) as lock:
        queued = client.post("/v1/forget", json={"target": {"session_id": session, "text": marker}})
        assert queued.status_code == 202, queued.text
        lock.wait_blocked(1)  # the worker, past the job's claim and its first look for a hold, takes the lease
        hold = _hold(client, session_id=session)
    job = wait_job(client, queued.json()["id"])
    assert job["status"] == "held" and job["hold_id"] == hold["id"] and job["sessions"] == [], job
    assert any(marker in (a.get("content") or "") for a in artifacts(client, session))

    assert client.delete(f"/v1/holds/{hold['id']}").json()["erasures"] == [job["id"]]
    done = wait_job(client, job["id"])
    assert done["status"] == "succeeded", done
    assert not any(marker in (a.get("content") or "") for a in artifacts(client, session))


def test_a_subjects_erasure_queued_before_a_hold_on_them_waits_on_it(client: httpx.Client, database_url: str) -> None:
    """The erasure is queued (202) and claimed; its first look for a hold on the subject is parked behind the
    subject's hold lock, held by the test while it places the hold (the statements `POST /v1/holds` runs): the
    job must find the hold and wait on it, erasing nothing, and run once the hold is released."""
    from app.holds.repository import scope_key

    dora = _subject()
    session, _ = run_script(client, [[user("Dora's note.")]], FAST, subject_id=dora)
    [row] = sql(database_url, "SELECT tenant_id FROM sessions WHERE id = $1", session)
    lock_name = scope_key(row["tenant_id"], "subject", dora)
    hold_id = "hld_" + uuid.uuid4().hex[:26]
    with HeldLock(database_url, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0)) IS NULL AS taken",
                  lock_name) as lock:
        queued = client.post(f"/v1/subjects/{dora}/erase", json={"wait": False})
        assert queued.status_code == 202 and queued.headers["Location"] == f"/v1/forget/{queued.json()['id']}"
        lock.wait_blocked(1)  # the worker, running the job, waits to look for a hold on the subject
        sql(database_url, "INSERT INTO holds (tenant_id, id, subject_id, reason) VALUES ($1, $2, $3, 'placed now')",
            row["tenant_id"], hold_id, dora)
    job = wait_job(client, queued.json()["id"])
    assert job["status"] == "held" and job["hold_id"] == hold_id and job["subject"] is None, job
    assert client.get(f"/v1/sessions/{session}").status_code == 200
    audit = client.get(f"/v1/holds/{hold_id}").json()
    assert audit["jobs"] == [job["id"]] and audit["events"][-1]["detail"] == {"forget_id": job["id"],
                                                                              "subject_id": dora}

    assert client.delete(f"/v1/holds/{hold_id}").json()["erasures"] == [job["id"]]
    done = wait_job(client, job["id"])
    assert done["status"] == "succeeded" and done["subject"]["sessions"] == [session], done
    problem(client.get(f"/v1/sessions/{session}"), 404)
