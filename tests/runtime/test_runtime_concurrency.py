"""Serialization of turns on one session, the bounded wait behind a held session, and an engine that is not ready."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.engine.protocol import CacheHandle
from app.sessions.endpoints import get_sessions
from tests.conftest import LiveServer, make_settings
from tests.runtime.runtime_helpers import artifacts, assert_tiles, create_session, session, turn, user
from tests.support import BOOTSTRAP_KEY, OverrideService, held_session, problem


def test_concurrent_turns_on_one_session_never_interleave(client: httpx.Client, live_server: LiveServer) -> None:
    sid = create_session(client, sampling={"temperature": 0, "max_tokens": 4, "seed": 3})
    texts = [f"Message number {i}." for i in range(4)]
    with ThreadPoolExecutor(max_workers=len(texts)) as pool, httpx.Client(
        base_url=live_server.base_url, headers={"Authorization": f"Bearer {BOOTSTRAP_KEY}"}, timeout=120
    ) as c:
        results = list(pool.map(lambda text: turn(c, sid, user(text)), texts))
    assert sorted(r["turn"] for r in results) == [1, 2, 3, 4]
    items = artifacts(client, sid)
    assert_tiles(items)
    by_turn = {r["turn"]: r for r in results}
    for t in range(1, 5):
        # Each transition's observation and reply are adjacent, in turn order: nothing of another turn in between.
        observation, reply = items[2 * t - 1], items[2 * t]
        assert (observation["turn"], reply["turn"]) == (t, t)
        assert observation["id"] == by_turn[t]["inputs"][0]["artifact_id"]
        assert reply["id"] == by_turn[t]["reply"]["artifact_id"]
        assert reply["parents"][-1] == observation["id"]
    assert session(client, sid)["turns"] == 4


@pytest.fixture
def short_lock_bound(override_service: OverrideService) -> None:
    """The live app with a 0.3 s bound on waiting for a held session (the default outlasts a slow turn)."""
    override_service(get_sessions, "sessions", session_lock_timeout_s=0.3)


def test_a_held_session_answers_409_session_busy_after_the_bound(
    client: httpx.Client, database_url: str, short_lock_bound: None
) -> None:
    sid = create_session(client)

    with held_session(database_url, sid):  # what a forget (or a turn in another process) holds while it works
        busy = client.post(f"/v1/sessions/{sid}/turns", json={"inputs": [user("hi")]})
        gone = client.delete(f"/v1/sessions/{sid}")
        state = client.get(f"/v1/sessions/{sid}").json()
    body = problem(busy, 409)
    assert body["type"].endswith("session_busy") and busy.headers["Retry-After"] == "2"
    problem(gone, 409)
    assert state["status"] == "running"  # reads never wait for the lease; they see that it is held
    assert turn(client, sid, user("hi"))["turn"] == 1 and session(client, sid)["status"] == "idle"


class _LoadingEngine:
    """An engine that never finishes loading: the runtime must answer 503, not 5xx-crash, and not hang."""

    name = "loading"
    model_id = "none"

    @property
    def ready(self) -> bool:
        return False

    @property
    def exactness(self) -> str:
        return "exact"

    @property
    def chat(self) -> Any:
        raise AttributeError("not loaded")

    async def start(self) -> None:
        await asyncio.Event().wait()

    async def close(self) -> None:
        return None

    async def release(self, handle: CacheHandle) -> None:
        return None


@pytest.fixture
def loading_server(data_dir: Path, database_url: str) -> Iterator[LiveServer]:
    server = LiveServer(make_settings(data_dir, database_url), engine=_LoadingEngine())  # type: ignore[arg-type]
    server.start_without_waiting()
    with httpx.Client(base_url=server.base_url) as probe:
        server.wait_listening(probe)
    yield server
    server.stop()


def test_an_engine_that_is_not_ready_answers_503_with_retry_after(loading_server: LiveServer) -> None:
    headers = {"Authorization": f"Bearer {BOOTSTRAP_KEY}"}
    with httpx.Client(base_url=loading_server.base_url, headers=headers, timeout=60) as c:
        r = c.post("/v1/sessions", json={"system_prompt": "Hi."})  # rendering the system block needs the tokenizer
        assert problem(r, 503) and r.headers["Retry-After"]
        sid = create_session(c, system_prompt=None)
        r = c.post(f"/v1/sessions/{sid}/turns", json={"inputs": [user("hi")]})
        assert problem(r, 503) and r.headers["Retry-After"]
        # An empty transition needs no engine.
        assert turn(c, sid, generate=False)["turn"] == 1
        assert c.delete(f"/v1/sessions/{sid}").status_code == 204
