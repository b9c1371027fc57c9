"""The running fleet of tests/fleet/test_fleet.py and what its tests do through it (plain functions, no fixtures)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from app.db.database import Database
from app.tenants.service import TenantService
from bench.fleet import Router, VLLMWorker, counter
from bench.serve import LetheServer
from tests.support import BOOTSTRAP_KEY

T = TypeVar("T")
SYSTEM = "You are a helpful assistant. Answer briefly." + " Be kind." * 60  # ~200 tokens: one full 128-token block
GREEDY = {"temperature": 0, "max_tokens": 8, "seed": 7}
SPARE = 2  # the spare worker's index in Fleet.workers
MAX_PLACEMENTS = 16  # new sessions tried to land one on a given worker (each half the time): 2^-16 to fail


@dataclass
class Fleet:
    """Two `vllm serve` workers behind vllm-router (consistent_hash, retries off: bench/fleet.py says why), two `lethe
    serve` processes on one PostgreSQL at the router, and a spare worker (`workers[SPARE]`) that loads meanwhile, off
    the ring, to replace a worker a test killed: off the ring, it moves no session while the other tests run."""

    workers: list[VLLMWorker]
    router: Router
    lethe: list[LetheServer]
    database_url: str

    def live(self) -> list[int]:
        return [i for i, worker in enumerate(self.workers) if worker.alive]

    def served(self) -> dict[int, float]:
        return {i: self.workers[i].served() for i in self.live()}

    def bring_in_spare(self) -> None:
        """The spare on the ring in place of the dead workers; the ring then holds two live workers again."""
        spare = self.workers[SPARE]
        spare.wait_ready()
        for worker in self.workers[:SPARE]:
            if not worker.alive:
                self.router.remove_worker(worker.url)
        self.router.add_worker(spare.url)


def client_for(server: LetheServer, key: str = BOOTSTRAP_KEY) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=600)


def other_tenant_key(database_url: str) -> str:
    async def create() -> str:
        db = Database(database_url, pool_size=1)
        try:
            return (await TenantService(db).create_tenant("control-" + uuid.uuid4().hex[:8]))[1]
        finally:
            await db.close()

    return asyncio.run(create())


def new_session(client: httpx.Client) -> str:
    r = client.post("/v1/sessions", json={"system_prompt": SYSTEM, "sampling": GREEDY})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def post_turn(client: httpx.Client, session_id: str, text: str) -> httpx.Response:
    return client.post(f"/v1/sessions/{session_id}/turns", json={"inputs": [{"type": "user", "content": text}]})


def turn(client: httpx.Client, session_id: str, text: str) -> dict[str, Any]:
    r = post_turn(client, session_id, text)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def landing(fleet: Fleet, work: Callable[[], T]) -> tuple[T, int]:
    """What `work` returned, and the one worker that served requests meanwhile (the tests send one at a time)."""
    before = fleet.served()
    result = work()
    after = fleet.served()
    moved = [i for i in after if after[i] > before.get(i, 0.0)]
    assert len(moved) == 1, f"requests landed on workers {moved} ({before} -> {after})"
    return result, moved[0]


def turn_on(fleet: Fleet, client: httpx.Client, session_id: str, text: str) -> tuple[dict[str, Any], int]:
    """A turn (200) and the worker that served it."""
    return landing(fleet, lambda: turn(client, session_id, text))


def session_on(fleet: Fleet, client: httpx.Client, worker: int | None = None) -> tuple[str, int]:
    """A new session with one turn behind it, and its worker; with `worker`, new sessions until one lands there
    (the router's ring places them: each lands on a given worker of two about half the time)."""
    for _ in range(MAX_PLACEMENTS):
        session_id = new_session(client)
        _, home = turn_on(fleet, client, session_id, "Hi! Please help me plan my week.")
        if worker is None or home == worker:
            return session_id, home
    raise AssertionError(f"no session landed on worker {worker} in {MAX_PLACEMENTS} tries")


def lethe_count(server: LetheServer, name: str, labels: str = "") -> float:
    return counter(httpx.get(f"{server.url}/metrics", timeout=30).text, name, labels)


def in_thread(work: Callable[[], T]) -> tuple[threading.Thread, dict[str, Any]]:
    """`work` started in a thread; the dict gets its "result" or its "error" once it ends."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = work()
        except Exception as exc:  # the request of a process the test killed ends in a transport error
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def artifacts(client: httpx.Client, session_id: str) -> list[dict[str, Any]]:
    r = client.get(f"/v1/sessions/{session_id}/artifacts")
    assert r.status_code == 200, r.text
    found: list[dict[str, Any]] = r.json()["artifacts"]
    return found


def wait_job(client: httpx.Client, job_id: str, limit_s: float = 600) -> dict[str, Any]:
    """The forget job once it finished (its own retries end it: 20 attempts at most)."""
    deadline = time.monotonic() + limit_s
    while True:
        job: dict[str, Any] = client.get(f"/v1/forget/{job_id}").json()
        if job["status"] not in ("queued", "running"):
            return job
        assert time.monotonic() < deadline, f"forget job still {job['status']}: {job}"
        time.sleep(0.2)  # polling a job, as a client does
