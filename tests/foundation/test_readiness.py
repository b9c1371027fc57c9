"""/readyz waits for the engine: 503 problem+json while it loads or after it failed, 200 once it is loaded.

The engine here is a stand-in whose loading the test controls; readiness logic is what is under test.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.engine.protocol import CacheHandle, ChatTemplate, Generation, Sampling, TokenSink, TokenUsage
from tests.conftest import LiveServer, make_settings


class GatedEngine:
    """Implements only what the lifespan and /readyz touch; generation is never called here."""

    name = "gated"
    model_id = "none"

    def __init__(self, fail: bool = False) -> None:
        self.gate = threading.Event()
        self.loaded = threading.Event()  # set once the app's loading task is done with this engine, either way
        self.fail = fail
        self._ready = False

    @property
    def chat(self) -> ChatTemplate:
        raise NotImplementedError

    async def start(self) -> None:
        # The task running this is the app's loading task (app/engine/slot.py): once it is done, the outcome is
        # recorded (the engine ready, or the slot's error), and /readyz can only report that.
        task = asyncio.current_task()
        assert task is not None
        task.add_done_callback(lambda _: self.loaded.set())
        await asyncio.to_thread(self.gate.wait, 60)
        if self.fail:
            raise RuntimeError("weights missing")
        self._ready = True

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def max_context_tokens(self) -> int | None:
        return None

    @property
    def exactness(self) -> str:
        return "exact"

    async def close(self) -> None:
        self.gate.set()

    async def open(self, session_key: str, *, salt: str | None = None, tokens: list[int] | None = None) -> CacheHandle:
        raise NotImplementedError

    async def prefill(self, handle: CacheHandle, token_ids: list[int]) -> TokenUsage:
        raise NotImplementedError

    async def generate(
        self, handle: CacheHandle, sampling: Sampling, on_tokens: TokenSink | None = None
    ) -> Generation:
        raise NotImplementedError

    async def crop(self, handle: CacheHandle, n_tokens: int) -> None:
        raise NotImplementedError

    async def fork(self, handle: CacheHandle, session_key: str) -> CacheHandle:
        raise NotImplementedError

    async def release(self, handle: CacheHandle) -> None:
        raise NotImplementedError


def _serve(data_dir: Path, database_url: str, engine: GatedEngine) -> Iterator[tuple[LiveServer, httpx.Client]]:
    server = LiveServer(make_settings(data_dir, database_url), engine=engine)  # type: ignore[arg-type]
    server.start_without_waiting()
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        server.wait_listening(client)
        yield server, client
    engine.gate.set()
    server.stop()


@pytest.fixture
def loading(data_dir: Path, database_url: str) -> Iterator[tuple[GatedEngine, httpx.Client]]:
    engine = GatedEngine()
    for _, client in _serve(data_dir, database_url, engine):
        yield engine, client


def test_not_ready_while_the_engine_loads_then_ready(loading: tuple[GatedEngine, httpx.Client]) -> None:
    engine, client = loading
    assert client.get("/healthz").status_code == 200
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.headers["retry-after"]
    assert response.json()["checks"] == {"database": "ok", "engine": "loading"}
    engine.gate.set()
    assert engine.loaded.wait(60), "the engine's loading task never finished"  # the limit only bounds that bug
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"] == {"database": "ok", "engine": "ok"}


def test_a_failed_engine_keeps_readyz_at_503_with_the_reason(data_dir: Path, database_url: str) -> None:
    engine = GatedEngine(fail=True)
    engine.gate.set()
    for _, client in _serve(data_dir, database_url, engine):
        assert engine.loaded.wait(60), "the engine's loading task never finished"  # the limit only bounds that bug
        response = client.get("/readyz")
        assert response.status_code == 503 and response.headers["retry-after"]
        assert response.json()["checks"] == {"database": "ok", "engine": "RuntimeError: weights missing"}
        assert client.get("/healthz").status_code == 200
