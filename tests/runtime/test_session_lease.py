"""The session lease: no transaction is open while a turn generates, and a turn whose lease was taken over writes
nothing, and one that outlasts its lease keeps it by renewing.

The races are forced: the generation is observed in progress through its own stream, and the lost lease is stolen
while the turn is provably parked at its commit (a FOR KEY SHARE lock held by the test blocks only the commit's
FOR UPDATE, not the lease's renewal nor the steal, both plain updates of non-key columns).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.sessions.endpoints import get_sessions
from tests.runtime.runtime_helpers import artifacts, assert_tiles, create_session, session, turn, user
from tests.support import (
    POLL_S,
    HeldLock,
    OverrideService,
    held_session,
    lethe_serve,
    problem,
    sql,
    until,
    wait_waiting,
)

COUNT = [user("Count from 1 to 10000, separated by commas.")]


def _lease_of(database_url: str, session_id: str) -> dict[str, Any]:
    row = sql(database_url, "SELECT lease_owner, status, lease_expires_at AS expires, lease_expires_at > now() AS live "
                            "FROM sessions WHERE id = $1", session_id)[0]
    return dict(row)


def _wait_leased(database_url: str, session_id: str, limit_s: float = 120) -> str:
    """A barrier: the turn has taken its session's lease. Returns the owner."""
    deadline = time.monotonic() + limit_s
    while (owner := _lease_of(database_url, session_id)["lease_owner"]) is None:
        assert time.monotonic() < deadline, "the turn never took its session"
        time.sleep(POLL_S)
    return str(owner)


@contextmanager
def _parked_at_its_commit(client: httpx.Client, database_url: str, sid: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """A turn sent in a thread, held at its commit for the block: it has taken the lease and generated, and its
    commit's FOR UPDATE waits behind the test's FOR KEY SHARE (which blocks neither the lease's renewals nor a plain
    update of it). Yields the lease owner and where the answer lands once the block ends and the turn commits."""
    answer: dict[str, Any] = {}

    def run() -> None:
        with httpx.Client(base_url=str(client.base_url), headers=client.headers, timeout=240) as c:
            answer["turn"] = c.post(f"/v1/sessions/{sid}/turns", json={"inputs": [user("Hello there.")]})

    thread = threading.Thread(target=run)
    thread.start()
    try:
        owner = _wait_leased(database_url, sid)
        with HeldLock(database_url, "SELECT 1 FROM sessions WHERE id = $1 FOR KEY SHARE", sid) as held:
            held.wait_blocked()
            yield owner, answer
    finally:
        thread.join(timeout=240)


def test_no_transaction_is_open_while_a_turn_generates(client: httpx.Client, database_url: str) -> None:
    sid = create_session(client, sampling={"max_tokens": 60})
    with client.stream("POST", f"/v1/sessions/{sid}/turns", json={"inputs": COUNT, "stream": True}) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()
        deltas = (line for line in lines if line == "event: delta")
        next(deltas)
        started = sql(database_url, "SELECT clock_timestamp() AS t")[0]["t"]
        for _ in range(10):  # the generation goes on: ten more tokens after that instant
            next(deltas)
        lease = _lease_of(database_url, sid)
        spanning = sql(
            database_url,
            "SELECT pid, state, query FROM pg_stat_activity WHERE backend_type = 'client backend' "
            "AND pid <> pg_backend_pid() AND xact_start IS NOT NULL AND xact_start < $1",
            started,
        )
        for _ in lines:  # to the end of the reply: the turn commits and lets the session go
            pass
    assert (lease["status"], lease["live"]) == ("running", True)  # the session is held all the same
    assert spanning == [], spanning  # no transaction opened before those tokens is still open
    after = session(client, sid)
    assert (after["status"], after["turns"]) == ("idle", 1)


def test_a_turn_whose_lease_was_taken_over_writes_nothing(client: httpx.Client, database_url: str) -> None:
    sid = create_session(client, sampling={"max_tokens": 16})
    before = artifacts(client, sid)
    with _parked_at_its_commit(client, database_url, sid) as (owner, answer):
        # Another process takes the session over (as if this one had stalled past its lease).
        stolen = sql(database_url, "UPDATE sessions SET lease_owner = 'thief', lease_expires_at = now() + "
                                   "interval '1 hour' WHERE id = $1 AND lease_owner = $2 RETURNING id", sid, owner)
        assert stolen
    body = problem(answer["turn"], 409)
    assert body["type"].endswith("session_busy") and "taken over" in body["detail"]
    assert session(client, sid)["turns"] == 0 and artifacts(client, sid) == before  # nothing half-written
    # The thief's lease is not the turn's to release; once it is gone, the session works on.
    assert _lease_of(database_url, sid)["lease_owner"] == "thief"
    sql(database_url, "UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL, status = 'idle' WHERE id = $1",
        sid)
    assert turn(client, sid, user("Hello again."))["turn"] == 1


@pytest.fixture
def one_second_lease(override_service: OverrideService) -> None:
    """The live app's turns with a 1 s session lease (renewed every third of a second while they work)."""
    override_service(get_sessions, "sessions", session_lease_s=1.0)


def test_a_turn_longer_than_its_lease_keeps_it_by_renewing(
    client: httpx.Client, database_url: str, one_second_lease: None
) -> None:
    """Parked at its commit, the turn outlives its 1 s lease (the database's clock passes the expiry the lease had
    when the turn was parked) and still holds the session, its expiry moved past that point by its own renewals; then
    it commits. Without renewals the expiry never moves and the wait below fails (its limit only bounds that bug).
    Whether a late heartbeat let the lease lapse for a moment on a loaded machine is not looked at: who holds it is."""
    sid = create_session(client, sampling={"max_tokens": 8})
    with _parked_at_its_commit(client, database_url, sid) as (owner, answer):
        # From here on only the heartbeat keeps the lease, which would run out at:
        first = _lease_of(database_url, sid)["expires"]
        rows: list[dict[str, Any]] = []

        def renewed_past_its_first_expiry() -> bool:
            row = dict(sql(database_url, "SELECT lease_owner, lease_expires_at AS expires, now() AS now "
                                         "FROM sessions WHERE id = $1", sid)[0])
            rows.append(row)
            assert row["lease_owner"] == owner, rows  # held by the turn all along: never let go, never taken
            return bool(row["now"] > first and row["expires"] > first)

        until(renewed_past_its_first_expiry, f"the turn's lease renewed past {first}, its first expiry", limit_s=120)
    assert answer["turn"].status_code == 200, answer["turn"].text
    assert answer["turn"].json()["turn"] == 1
    assert _lease_of(database_url, sid)["lease_owner"] is None  # released


def test_turns_from_two_api_processes_take_the_session_one_at_a_time(
    client: httpx.Client, database_url: str, tmp_path: Path
) -> None:
    """Four turns on one session, two through each of two API processes, all released at once: each process has one
    turn polling for the lease and one queued behind it in the process (seen in both processes' gauges) when the
    session is let go, so they provably race for it across processes."""
    sid = create_session(client, sampling={"max_tokens": 4, "seed": 5})
    other = lethe_serve(database_url, tmp_path)
    results: list[httpx.Response] = []
    try:
        other.wait_ready()
        urls = [str(client.base_url), other.url]

        def post(url: str, text: str) -> None:
            with httpx.Client(base_url=url, headers=client.headers, timeout=240) as c:
                results.append(c.post(f"/v1/sessions/{sid}/turns", json={"inputs": [user(text)]}))

        threads = [threading.Thread(target=post, args=(urls[i % 2], f"Message {i}.")) for i in range(4)]
        with held_session(database_url, sid):
            for thread in threads:
                thread.start()
            for url in urls:
                wait_waiting(url, 2)
        for thread in threads:
            thread.join(timeout=300)
    finally:
        other.stop()
    assert [r.status_code for r in results] == [200] * 4, [r.text for r in results]
    assert sorted(r.json()["turn"] for r in results) == [1, 2, 3, 4]
    items = artifacts(client, sid)
    assert_tiles(items)
    by_turn = {r.json()["turn"]: r.json() for r in results}
    for t in range(1, 5):  # each transition's observation and reply adjacent, in turn order
        observation, reply = items[2 * t - 1], items[2 * t]
        assert observation["id"] == by_turn[t]["inputs"][0]["artifact_id"]
        assert reply["id"] == by_turn[t]["reply"]["artifact_id"]
