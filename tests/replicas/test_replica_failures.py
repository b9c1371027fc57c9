"""Read replicas under load and under failure, with a real primary, a real streaming replica and a real `lethe serve`:

- the memory history check (bench/memory_history.py) over concurrent clients, each the real Python client with its
  default settings, while the replica's replay is paused and resumed under them: no client ever reads a value it
  saw forgotten, and the replica really served reads (else the check would prove nothing about it);
- the replica killed by pid under concurrent reads: they fall back to the primary, not one 5xx, and come back to the
  replica once it is up;
- a failover (the replica promoted): tokens from the old timeline read the new primary, correctly.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
from lethe_client import Forgotten, LetheClient, NotFound, PreconditionFailed

from app.db.consistency import ConsistencyToken
from bench.memory_history import Op, Recorder, check_history
from bench.replication import ReplicaPair
from bench.serve import LetheServer
from tests.replicas.replica_helpers import HEADER, client_of, lethe_on, reads, served
from tests.support import BOOTSTRAP_KEY, POLL_S, problem

WAIT_MS = 200


@pytest.fixture(scope="module")
def server(pair: ReplicaPair) -> Iterator[LetheServer]:
    with lethe_on(pair, LETHE_REPLICA_WAIT_MS=str(WAIT_MS)) as lethe:
        yield lethe


@pytest.fixture
def ns() -> str:
    return "f-" + uuid.uuid4().hex[:10]


def _until(condition: object, what: str, limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(POLL_S)


# ---- the history check, reads spread over the replica ----------------------------------------------------------


def _agent(url: str, ns: str, keys: list[str], n_ops: int, seed: int, start: threading.Barrier, rec: Recorder) -> None:
    rng = random.Random(seed)
    reader = f"agent-{seed}"
    known = dict.fromkeys(keys, 1)  # the version this agent last saw per key, often stale by the time it writes
    with LetheClient(url, BOOTSTRAP_KEY) as lethe:  # default settings: it keeps and sends its newest token itself
        start.wait()
        for _ in range(n_ops):
            key, roll, t0 = rng.choice(keys), rng.random(), time.monotonic()
            if roll < 0.5:
                try:
                    record = lethe.get(ns, key)
                    op = Op("read", key, t0, 0, 200, version=record.version, tag=record.value, reader=reader)
                except Forgotten as gone:
                    op = Op("read", key, t0, 0, 404, version=gone.version, forgotten=True, reader=reader)
                known[key] = op.version or 0
            elif roll < 0.85:
                tag, base = uuid.uuid4().hex, known[key]
                try:
                    written = lethe.put(ns, key, tag, if_match=base or None, if_none_match=base == 0, source="agent")
                    op = Op("write", key, t0, 0, 201 if written.created else 200, base=base, version=written.version,
                            tag=tag, reader=reader)
                    known[key] = written.version
                except PreconditionFailed as stale:
                    op = Op("write", key, t0, 0, 412, base=base, version=stale.current_version, tag=tag,
                            reader=reader)
                    if rng.random() < 0.5:  # half the time, retry from the fresh version
                        known[key] = stale.current_version
            else:
                forgot = lethe.forget(ns, key)
                op = Op("forget", key, t0, 0, 200, version=forgot.version, forgotten=forgot.already_forgotten,
                        reader=reader)
            op.end = time.monotonic()
            rec.add(op)


def test_no_client_reads_what_it_saw_forgotten_while_the_replica_lags_under_load(
    pair: ReplicaPair, server: LetheServer, ns: str
) -> None:
    keys = ["allergy.peanut", "diet", "city", "employer"]
    with LetheClient(server.url, BOOTSTRAP_KEY) as seeder:
        for key in keys:
            seeder.put(ns, key, "seed", if_none_match=True)
    pair.wait_caught_up()
    agents, n_ops = 12, 80
    rec = Recorder()
    start = threading.Barrier(agents)
    before = reads(server.url)
    threads = [
        threading.Thread(target=_agent, args=(server.url, ns, keys, n_ops, seed, start, rec)) for seed in range(agents)
    ]
    for t in threads:
        t.start()
    _shape_lag(pair, rec, threads)
    for t in threads:
        t.join(timeout=600)
    assert len(rec.ops) == agents * n_ops  # every agent finished: no exception, no 5xx (the client raises on those)

    counts = check_history(rec.ops, per_reader=True)
    routed = served(server.url, before)
    print("replica history check:", counts, dict(routed))
    assert counts["resurrections"] == 0 and counts["stale_reads"] == 0
    assert counts["stale_writes_landed"] == 0 and counts["cas_violations"] == 0 and counts["duplicate_versions"] == 0
    assert counts["forgets"] > 10 and counts["writes_rejected"] > 10 and counts["writes_landed"] > 10
    # The check has power only if the replica served reads, lagging ones among them.
    assert routed[("replica", "token")] + routed[("replica", "untokened")] > 0
    assert routed[("primary", "lagging")] > 0


def _shape_lag(pair: ReplicaPair, rec: Recorder, agents: list[threading.Thread], phase_ops: int = 60) -> None:
    """Pause and resume the replica's replay in turns, a phase lasting `phase_ops` recorded operations (driven by the
    agents' progress, not by time), until the agents are done; replay runs again afterwards."""
    paused = False
    try:
        while any(a.is_alive() for a in agents):
            if paused:
                pair.resume_replay()
            else:
                pair.pause_replay()
            paused = not paused
            mark = len(rec.ops)
            while len(rec.ops) < mark + phase_ops and any(a.is_alive() for a in agents):
                time.sleep(POLL_S)
    finally:
        pair.resume_replay()


# ---- the replica killed ---------------------------------------------------------------------------------------


def test_a_killed_replica_sends_reads_to_the_primary_without_one_error(
    pair: ReplicaPair, server: LetheServer, ns: str
) -> None:
    with client_of(server) as http:
        written = http.put(f"/v1/memory/{ns}/k", json={"value": "v", "source": "user"}, headers={"If-None-Match": "*"})
    token = written.headers[HEADER]
    pair.wait_caught_up()
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    stop = threading.Event()

    def read_on(tokened: bool) -> None:
        with client_of(server) as http:
            while not stop.is_set():
                try:
                    r = http.get(f"/v1/memory/{ns}/k", headers={HEADER: token} if tokened else {})
                    statuses[r.status_code] += 1
                    assert r.status_code != 200 or r.json()["value"] == "v"
                except (httpx.TransportError, AssertionError) as exc:
                    failures.append(f"{time.monotonic() - started:.3f}s {exc!r}")

    started, events = time.monotonic(), {}  # when things happened, to read a failure against
    readers = [threading.Thread(target=read_on, args=(i % 2 == 0,)) for i in range(4)]
    before = reads(server.url)
    for t in readers:
        t.start()
    try:
        _until(lambda: served(server.url, before)[("replica", "token")] > 5, "tokened reads on the replica")
        events["killed"] = time.monotonic() - started
        pair.replica.kill()
        _until(lambda: served(server.url, before)[("primary", "replica_down")] > 0, "reads falling back")
        events["fell back"] = time.monotonic() - started
        fell_back = sum(statuses.values())
        _until(lambda: sum(statuses.values()) > fell_back + 50, "reads going on without the replica")
        events["restarting"] = time.monotonic() - started
        pair.replica.start()
        pair.wait_caught_up()
        events["caught up"] = time.monotonic() - started
        back = served(server.url, before)[("replica", "untokened")]
        _until(lambda: served(server.url, before)[("replica", "untokened")] > back + 5, "the replica serving again")
    finally:
        stop.set()
        for t in readers:
            t.join(timeout=120)
    assert failures == [], (events, server.log_tail())
    assert set(statuses) == {200}, statuses  # not one 5xx


# ---- failover -------------------------------------------------------------------------------------------------


def test_after_a_promotion_old_tokens_read_the_new_primary(pair: ReplicaPair, server: LetheServer, ns: str) -> None:
    """The old primary goes away and its replica is promoted (a new timeline); Lethe is pointed at it, and its replica
    list still names it (a DNS name that followed the failover). A token from the old timeline cannot be compared
    with positions on the new one, so it reads the primary: correctly, the forget included."""
    with client_of(server) as http:
        http.put(f"/v1/memory/{ns}/kept", json={"value": "v", "source": "user"}, headers={"If-None-Match": "*"})
        http.put(f"/v1/memory/{ns}/gone", json={"value": "v", "source": "user"}, headers={"If-None-Match": "*"})
        forgot = http.delete(f"/v1/memory/{ns}/gone")
    old = ConsistencyToken.parse(forgot.headers[HEADER])
    pair.wait_caught_up()
    pair.primary.stop()
    pair.promote()
    with lethe_on(pair, primary=pair.replica.url, replicas=pair.replica.url) as failed_over, \
            client_of(failed_over) as http:
        before = reads(failed_over.url)
        assert problem(http.get(f"/v1/memory/{ns}/gone", headers={HEADER: old.encode()}), 404)["forgotten"] is True
        kept = http.get(f"/v1/memory/{ns}/kept", headers={HEADER: old.encode()})
        assert kept.status_code == 200 and kept.json()["value"] == "v"
        assert served(failed_over.url, before) == {("primary", "other_timeline"): 2}

        rewritten = http.put(f"/v1/memory/{ns}/gone", json={"value": "w", "source": "user"},
                             headers={"If-Match": f'"{forgot.json()["version"]}"'})
        new = ConsistencyToken.parse(rewritten.headers[HEADER])
        assert (new.system_id, new.timeline) == (old.system_id, old.timeline + 1)
        with LetheClient(failed_over.url, BOOTSTRAP_KEY) as lethe:
            lethe.observe_consistency(old.encode())
            lethe.observe_consistency(new.encode())
            assert lethe.consistency == new.encode()  # the new timeline is the later history
            assert lethe.get(ns, "gone").value == "w"
            with pytest.raises(NotFound):
                lethe.get(ns, "never")
