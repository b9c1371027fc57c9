"""The prefix-cache leak after a forget, end to end: a real server on the in-process vLLM engine, turns and forgets
through HTTP (the runtime's transitions, the forget job's replay and swap), and the probe a user can make, reading
`usage.reused_tokens` in a turn's answer.

The baseline is a control session of *another tenant* running the same turns: whatever the salts, it can reuse only
blocks it computed itself, so its `reused_tokens` for the probe turn is what a session that never met the target
gets. A probe that gets more was served blocks computed from the forgotten message. (Before per-session salts,
probe (a) got 128 tokens more, and probe (b) too: this file, run on that code, measured it.)
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from app.db.database import Database
from app.db.embedded import start_embedded_postgres
from app.tenants.service import TenantService
from tests.conftest import LiveServer, make_settings
from tests.support import BOOTSTRAP_KEY

SYSTEM = "You are a helpful assistant. Answer briefly." + " Be kind." * 60  # ~200 tokens: one clean full block
GREEDY = {"temperature": 0, "max_tokens": 16, "seed": 7}
T1 = "Hi! Please help me plan my week."
T3 = "Suggest a time for my morning runs."
SECRET = (
    "A private note for you: my locker code is 4471-ZQ, my cat is called Brindlewick, my bank PIN is 8203, "
    "my passport number is X7731902, my sister Margit lives at 14 Quai Voltaire in Lyon, my doctor is Dr. Olmsted, "
    "and my password hint is the name of my first boat, the Sea Lark, which I sold in 2011 to a man named Ferro."
)


@dataclass
class Served:
    live: LiveServer
    database_url: str


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """On a database of its own: another test server on the suite's database would run a forget worker (on its own
    engine) that could claim this module's jobs."""
    data = tmp_path_factory.mktemp("vllm-forget-api")
    url = start_embedded_postgres(data / "pg")
    live = LiveServer(make_settings(data, url, engine="vllm"))
    live.start(ready_timeout=600)
    yield Served(live, url)
    live.stop()


def client_for(server: Served, key: str) -> httpx.Client:
    return httpx.Client(base_url=server.live.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=600)


def other_tenant_key(server: Served) -> str:
    async def create() -> str:
        db = Database(server.database_url, pool_size=1)
        try:
            return (await TenantService(db).create_tenant("control-" + uuid.uuid4().hex[:8]))[1]
        finally:
            await db.close()

    return asyncio.run(create())


def new_session(client: httpx.Client) -> str:
    r = client.post("/v1/sessions", json={"system_prompt": SYSTEM, "sampling": GREEDY})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def turn(client: httpx.Client, session_id: str, text: str) -> dict[str, Any]:
    r = client.post(f"/v1/sessions/{session_id}/turns", json={"inputs": [{"type": "user", "content": text}]})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def forget(client: httpx.Client, artifact_id: str) -> dict[str, Any]:
    r = client.post("/v1/forget", json={"target": {"artifact_id": artifact_id}, "wait": True})
    assert r.status_code in (200, 202), r.text
    job: dict[str, Any] = r.json()
    while job["status"] in ("queued", "running"):
        job = client.get(f"/v1/forget/{job['id']}").json()
    assert job["status"] == "succeeded", job
    return job


def test_no_request_reaches_the_forgotten_blocks_through_the_api(server: Served) -> None:
    with client_for(server, BOOTSTRAP_KEY) as tenant, client_for(server, other_tenant_key(server)) as control:
        baseline_session = new_session(control)
        turn(control, baseline_session, T1)
        baseline = turn(control, baseline_session, SECRET)["usage"]["reused_tokens"]

        # (a) S = T1, the target, T3; the target is forgotten (selective replay of transitions 2..3). Then another
        # session of the same tenant rebuilds the exact forgotten prefix: the system block, T1, the target's text.
        s = new_session(tenant)
        turn(tenant, s, T1)
        target = turn(tenant, s, SECRET)["inputs"][0]["artifact_id"]
        turn(tenant, s, T3)
        receipt = forget(tenant, target)["sessions"][0]
        assert receipt["transitions_replayed"] == 2 and receipt["tokens"]["reused"] > 0
        assert receipt["exactness"] == "batched"  # vLLM batches by default: the receipt says so
        metrics = tenant.get("/metrics").text  # the replay's wait in vLLM's queue, and none of vLLM's own metrics
        assert 'lethe_forget_engine_wait_seconds_count{priority="forget"} 1.0' in metrics and "vllm:" not in metrics
        probe = new_session(tenant)
        turn(tenant, probe, T1)
        probe_a = turn(tenant, probe, SECRET)["usage"]["reused_tokens"]
        after = turn(tenant, s, "Thanks!")["usage"]  # S's own next turn

        # (b) S2 = T1, the target: the target is the last transition, so the forget replays nothing and leaves S2's
        # log a prefix of the old one; S2's next turn sends the target's text again, at the same position.
        s2 = new_session(tenant)
        turn(tenant, s2, T1)
        target2 = turn(tenant, s2, SECRET)["inputs"][0]["artifact_id"]
        forget(tenant, target2)
        probe_b = turn(tenant, s2, SECRET)["usage"]["reused_tokens"]

    print(
        f"reused_tokens of the probe turn: control (another tenant) {baseline}; (a) another session of the tenant "
        f"{probe_a}; (b) the same session after forgetting its last turn {probe_b}; S's next turn after its forget "
        f"reused {after['reused_tokens']} of {after['prompt_tokens']}"
    )
    assert probe_a <= baseline and probe_b <= baseline
    assert after["reused_tokens"] > 0  # prefix caching still serves a session's own turns after a forget
