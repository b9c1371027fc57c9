"""A forget is a barrier: a turn that arrives while it runs waits, then applies to the rebuilt state; two forgets on
one session serialize; a job survives the death of the process running it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx

from app.db.embedded import start_embedded_postgres
from bench.serve import LetheServer
from tests.forget.forget_helpers import artifacts, assert_tiles, forget, post_turn, run_script, shape, user, wait_job
from tests.support import BOOTSTRAP_KEY, HeldLock, lethe_serve, sql, stored_artifacts, wait_waiting

SAMPLING = {"temperature": 0, "max_tokens": 8, "seed": 5}  # short replies: the barriers, not slowness, force the races
SECRET = "passport X1234567"

SCRIPT = [
    [user(f"My passport number is {SECRET}.")],
    [user("Plan a trip to Rome.")],
    [user("What should I pack?")],
    [user("Any museum tips?")],
]
COUNTERFACTUAL: list[list[dict[str, Any]]] = [[], *SCRIPT[1:]]


def parked_at_its_swap(database_url: str, artifact_id: str) -> HeldLock:
    """A share lock on the artifact a forget will delete: the forget runs its replay, then parks in its swap (inside
    the transaction that holds the session) until the lock is released. Take it before submitting the forget."""
    return HeldLock(database_url, "SELECT 1 FROM artifacts WHERE id = $1 FOR SHARE", artifact_id)


def test_a_turn_during_a_forget_waits_and_applies_to_the_new_state(
    client: httpx.Client, database_url: str, tmp_path: Path
) -> None:
    """The late turn goes to the API process that is not running the forget, so it waits for the session's lease in
    PostgreSQL (within one process it would queue in that process first) and is seen waiting for the forget."""
    session_id, ids = run_script(client, SCRIPT, SAMPLING)
    other = lethe_serve(database_url, tmp_path)
    answers: dict[str, Any] = {}
    try:
        other.wait_ready()
        with parked_at_its_swap(database_url, ids[0][0]) as swap:
            job = forget(client, {"artifact_id": ids[0][0]})
            swap.wait_blocked(1)  # the forget holds the session and has replayed; its swap waits for the test
            assert client.get(f"/v1/sessions/{session_id}").json()["status"] == "forgetting"
            owner = sql(database_url, "SELECT lease_owner FROM forget_jobs WHERE id = $1", job["id"])[0]
            late_url = str(client.base_url) if f":{other.proc.pid}:" in owner["lease_owner"] else other.url

            def late_turn() -> None:
                with httpx.Client(base_url=late_url, headers=client.headers, timeout=240) as late:
                    answers["turn"] = late.post(f"/v1/sessions/{session_id}/turns",
                                                json={"inputs": [user("Thanks, bye!")]})

            thread = threading.Thread(target=late_turn)
            thread.start()
            wait_waiting(late_url)  # the late turn waits for the session the parked forget holds
        done = wait_job(client, job["id"])
        thread.join(timeout=240)
    finally:
        other.stop()
    assert done["status"] == "succeeded", done
    response = answers["turn"]
    assert response.status_code == 200, response.text
    assert (response.json()["turn"], response.json()["epoch"]) == (5, 1)  # after the forget's swap, not before it

    reference_id, _ = run_script(client, [*COUNTERFACTUAL, [user("Thanks, bye!")]], SAMPLING)
    after = artifacts(client, session_id)
    assert shape(after, database_url) == shape(artifacts(client, reference_id), database_url)
    assert not [a for a in after if SECRET in a["content"]]


def test_two_forgets_on_one_session_serialize(client: httpx.Client, database_url: str) -> None:
    session_id, ids = run_script(client, SCRIPT, SAMPLING)
    first = forget(client, {"artifact_id": ids[0][0]})
    second = forget(client, {"artifact_id": ids[2][0]})
    assert wait_job(client, first["id"])["status"] == "succeeded"
    done = wait_job(client, second["id"])
    assert done["status"] == "succeeded", done
    assert done["sessions"][0]["epoch_before"] == 1 and done["sessions"][0]["epoch_after"] == 2
    reference_id, _ = run_script(client, [[], SCRIPT[1], [], SCRIPT[3]], SAMPLING)
    after = artifacts(client, session_id)
    assert shape(after, database_url) == shape(artifacts(client, reference_id), database_url)
    assert_tiles(after)


def test_a_job_survives_a_crash_before_its_swap_commits(tmp_path: Path) -> None:
    """kill -9 of the process running a forget, parked inside the forget's transaction (replayed, not committed);
    a restarted process finishes the job. On a database of its own: the suite's in-process server would otherwise
    run a forget worker on the same queue and could be the one to claim the job, which the test cannot kill."""
    database_url = start_embedded_postgres(tmp_path / "own-db")
    headers = {"Authorization": f"Bearer {BOOTSTRAP_KEY}"}
    # The only worker on its database, so no other takes the job over while it runs; a short lease lets the
    # restarted one take it over within seconds of the crash.
    lease = {"LETHE_FORGET_LEASE_S": "2", "LETHE_FORGET_POLL_S": "0.2", "LETHE_SESSION_LEASE_S": "2"}
    first = lethe_serve(database_url, tmp_path, **lease)
    second: LetheServer | None = None
    try:
        first.wait_ready()
        with httpx.Client(base_url=first.url, headers=headers, timeout=120) as crashing:
            session_id, ids = run_script(crashing, SCRIPT, SAMPLING)
            with parked_at_its_swap(database_url, ids[0][0]) as swap:
                job = forget(crashing, {"artifact_id": ids[0][0]})
                swap.wait_blocked()  # replayed, not committed: the process dies inside the forget's transaction
                owner = sql(database_url, "SELECT lease_owner FROM forget_jobs WHERE id = $1", job["id"])[0]
                assert f":{first.proc.pid}:" in owner["lease_owner"]  # the only worker on this database
                first.kill()
        assert sql(database_url, "SELECT status FROM forget_jobs WHERE id = $1", job["id"])[0]["status"] == "running"
        # the dead process's lease on the session is still there (it expires on its own)
        assert sql(database_url, "SELECT status FROM sessions WHERE id = $1", session_id)[0]["status"] == "forgetting"
        # the session is exactly as it was: nothing of the half-done forget committed
        assert sql(database_url, "SELECT epoch FROM sessions WHERE id = $1", session_id)[0]["epoch"] == 0
        holding = stored_artifacts(database_url, "WHERE session_id = $1", session_id)
        assert [a for a in holding if SECRET in a["content"]]
        # Restarted, the new process takes the job over once the dead one's lease expires.
        second = lethe_serve(database_url, tmp_path, **lease)
        second.wait_ready()
        with httpx.Client(base_url=second.url, headers=headers, timeout=120) as survivor:
            done = wait_job(survivor, job["id"])
            assert done["status"] == "succeeded", done
            attempts = sql(database_url, "SELECT attempts FROM forget_jobs WHERE id = $1", job["id"])[0]["attempts"]
            assert attempts == 2
            after = artifacts(survivor, session_id)
            reference_id, _ = run_script(survivor, COUNTERFACTUAL, SAMPLING)
            assert shape(after, database_url) == shape(artifacts(survivor, reference_id), database_url)
            assert_tiles(after)
            assert survivor.get(f"/v1/sessions/{session_id}").json()["epoch"] == 1
            post_turn(survivor, session_id, [user("And the weather?")])
    finally:
        first.stop()
        if second is not None:
            second.stop()
