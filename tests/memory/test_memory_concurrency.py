"""Forget is an ordered barrier under concurrency: the note's summarizer race, then a randomized history check.

Invariant (../shared/seeds/002_*.txt): once forget(k) has returned, no write based on a version older than the
tombstone is ever readable, until a write based on the tombstone version re-establishes the key.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench.memory_history import Op, Recorder, check_history
from tests.memory.memory_helpers import create
from tests.support import HeldLock, lethe_serve, problem


async def test_summarizer_write_in_flight_across_the_forget_is_rejected(
    live_server: Any, api_key: str, database_url: str, ns: str
) -> None:
    """The note's scenario, made deterministic: the summarizer's batch (based on the pre-forget version) is provably
    in flight while the forget is applied, and still rejected; the next read says forgotten."""
    path = f"/v1/memory/{ns}/allergy.peanut"
    headers = {"Authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(base_url=live_server.base_url, headers=headers, timeout=60) as c:
        r = await c.put(path, json={"value": True, "source": "user"}, headers={"If-None-Match": "*"})
        read_by_summarizer = r.json()["version"]

        # The test holds the namespace's records; the forget queues first behind it, then the summarizer's batch.
        with HeldLock(database_url, "SELECT 1 FROM memory_records WHERE namespace = $1 FOR UPDATE", ns) as held:
            forget = asyncio.create_task(c.delete(path))  # the user's correction: first in the lock queue
            await asyncio.to_thread(held.wait_blocked, 1)
            batch = asyncio.create_task(
                c.post(
                    f"/v1/memory/{ns}:batch",
                    json={
                        "atomic": False,
                        "writes": [
                            {
                                "key": "allergy.peanut",
                                "value": True,
                                "base_version": read_by_summarizer,
                                "source": "summarizer",
                            },
                        ],
                    },
                )
            )
            await asyncio.to_thread(held.wait_blocked, 2)
        forgot, flushed = await forget, await batch

        assert forgot.status_code == 200 and forgot.json()["already_forgotten"] is False
        tombstone = forgot.json()["version"]
        assert flushed.status_code == 200
        [result] = flushed.json()["results"]
        assert result["status"] == 412 and result["forgotten"] is True and result["current_version"] == tombstone
        body = problem(await c.get(path), 404)
        assert body["forgotten"] is True and body["version"] == tombstone


# ---- randomized: many writers and forgetters on a few keys, every operation timed, then a checker ----------------


def _worker(
    base_url: str,
    api_key: str,
    ns: str,
    keys: list[str],
    n_ops: int,
    seed: int,
    start: threading.Barrier,
    rec: Recorder,
) -> None:
    rng = random.Random(seed)
    known = dict.fromkeys(keys, 0)  # the version this worker last saw per key, often stale by the time it writes
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {api_key}"}, timeout=60) as c:
        start.wait()
        for _ in range(n_ops):
            key = rng.choice(keys)
            path = f"/v1/memory/{ns}/{key}"
            roll = rng.random()
            t0 = time.monotonic()
            if roll < 0.4:
                r = c.get(path)
                body = r.json()
                op = Op(
                    "read",
                    key,
                    t0,
                    time.monotonic(),
                    r.status_code,
                    version=body.get("version"),
                    tag=body.get("value") if r.status_code == 200 else None,
                    forgotten=bool(body.get("forgotten")),
                )
                known[key] = body.get("version", known[key])
            elif roll < 0.85:
                tag = uuid.uuid4().hex
                base = known[key]
                cond = {"If-None-Match": "*"} if base == 0 else {"If-Match": f'"{base}"'}
                r = c.put(path, json={"value": tag, "source": "summarizer"}, headers=cond)
                body = r.json()
                version = body.get("version") if r.status_code in (200, 201) else body.get("current_version")
                op = Op("write", key, t0, time.monotonic(), r.status_code, base=base, version=version, tag=tag)
                if r.status_code in (200, 201) or rng.random() < 0.5:  # half the time, retry from the fresh version
                    known[key] = version or 0
            else:
                r = c.delete(path)
                op = Op(
                    "forget",
                    key,
                    t0,
                    time.monotonic(),
                    r.status_code,
                    version=r.json()["version"],
                    forgotten=r.json()["already_forgotten"],
                )
            rec.add(op)


def test_randomized_writers_and_forgetters_never_resurrect(
    client: httpx.Client, api_key: str, ns: str, live_server: Any
) -> None:
    _randomized(client, api_key, ns, [live_server.base_url])


def test_randomized_across_two_api_processes(
    client: httpx.Client, api_key: str, ns: str, live_server: Any, database_url: str, tmp_path: Path
) -> None:
    """The same check with half the clients on a second `lethe serve` process over the same database: the barrier
    is PostgreSQL's, not a process's."""
    second = lethe_serve(database_url, tmp_path)
    try:
        second.wait_ready()
        _randomized(client, api_key, ns, [live_server.base_url, second.url])
    finally:
        second.stop()


def _randomized(client: httpx.Client, api_key: str, ns: str, base_urls: list[str]) -> None:
    keys = ["allergy.peanut", "diet", "city"]
    for key in keys:
        create(client, ns, key, "seed")
    threads, n_ops = 16, 60
    start = threading.Barrier(threads)
    rec = Recorder()
    workers = [
        threading.Thread(
            target=_worker, args=(base_urls[seed % len(base_urls)], api_key, ns, keys, n_ops, seed, start, rec)
        )
        for seed in range(threads)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert len(rec.ops) == threads * n_ops
    assert all(o.status in (200, 201, 404, 412) for o in rec.ops), {o.status for o in rec.ops}

    counts = check_history(rec.ops)
    print("concurrency check:", counts)
    assert counts["resurrections"] == 0
    assert counts["stale_writes_landed"] == 0
    assert counts["stale_reads"] == 0
    assert counts["cas_violations"] == 0 and counts["duplicate_versions"] == 0
    assert counts["forgets"] > 10 and counts["writes_rejected"] > 10 and counts["writes_landed"] > 10

    # the server's history agrees with what the clients saw: contiguous versions, one per landed operation
    landed = {
        (o.key, o.version): o
        for o in rec.ops
        if (o.kind == "write" and o.status in (200, 201)) or (o.kind == "forget" and not o.forgotten)
    }
    for key in keys:
        history = client.get(f"/v1/memory/{ns}/{key}/history").json()["versions"]
        assert [h["version"] for h in history] == list(range(1, len(history) + 1))
        last_tombstone = max((h["version"] for h in history if h["op"] == "forget"), default=0)
        for h in history[1:]:  # version 1 is the seed
            op = landed[(key, h["version"])]
            assert h["op"] == op.kind
            if h["op"] == "write":
                assert h["value"] == (op.tag if h["version"] > last_tombstone else None)
