"""Shared fixtures: one embedded PostgreSQL per test run, and a real HTTP server running the real app.

Everything here is real: pgserver's PostgreSQL 16 with pgvector, uvicorn on a loopback port, httpx as the client.
The converted model is cached under .lethe/models in the checkout so only the first run pays for the conversion.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from app.db.embedded import start_embedded_postgres
from app.engine.protocol import KVEngine
from app.main import create_app
from app.settings import Settings
from app.web.deps import ContainerDep
from tests.support import (
    BOOTSTRAP_KEY,
    MODEL_CACHE,
    WEBHOOK_SECRET,
    OverrideService,
    free_port,
    new_tenant_key,
    rewired,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The suite's hf engines run one thread each: the build machines have 2 cores shared with other work, and beside one
# busy process two threads fight it for one core (a decode step 123 ms on 2 threads, 54 ms on 1; two forget test
# files 382.6 s against 189.9 s: docs/performance.md, Suite time). Servers the tests start as processes inherit it;
# a LETHE_HF_THREADS set outside wins.
os.environ.setdefault("LETHE_HF_THREADS", "1")


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


# A run stopped with SIGTERM (a CI timeout, `kill`) ends like Ctrl-C: pytest tears the fixtures down and the exit
# handlers stop every embedded PostgreSQL the run started. With the default disposition they would outlive it.
signal.signal(signal.SIGTERM, _interrupt)

# `make test` runs two workers (pytest-xdist, `--dist loadfile --no-loadscope-reorder`): a worker that runs dry takes
# the next file in this order. The longest files go first, so the run does not end with one worker inside a long
# file while the other idles. Seconds per file, measured with `--durations=0` (docs/performance.md, Suite time);
# the order only changes how long the run takes, and every other file keeps its place after these.
LONGEST_FILES = {
    "tests/fleet/test_fleet.py": 184,
    "tests/engine_vllm/test_vllm_local.py": 143,
    "tests/forget/test_forget_exactness.py": 122,
    "tests/engine_vllm/test_vllm_forget_salt.py": 118,
    "tests/eval/test_eval_smoke.py": 116,
    "tests/retrieval/test_retrieval_forget.py": 106,
    "tests/foundation/test_serve_process.py": 101,
    "tests/engine_vllm/test_vllm_forget_api.py": 97,
    "tests/foundation/test_schemathesis.py": 86,
    "tests/forget/test_verified_replay.py": 85,
    "tests/engine_vllm/test_vllm_remote.py": 77,
    "tests/engine/test_hf_exactness.py": 70,
    "tests/engine_vllm/test_vllm_scheduler.py": 63,
    "tests/forget/test_forget_concurrency.py": 62,
    "tests/openai_compat/test_agents_sdk.py": 57,
    "tests/client/test_frameworks.py": 55,
    "tests/forget/test_forget_tools.py": 54,
    "tests/foundation/test_http_workers.py": 50,
    "tests/forget/test_exactness_workers.py": 50,
    "tests/replicas/test_erasure_in_copies.py": 70,
    "tests/forget/test_forget_targets_at_rest.py": 56,
}
_ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: -LONGEST_FILES.get(item.path.relative_to(_ROOT).as_posix(), 0))  # stable


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("lethe-data")
    # Every process the run starts over its databases is one deployment on one machine: one local key store, as
    # `lethe serve` processes beside each other must share (a second process with its own would read the first's
    # ciphertexts as tampered). Servers started as processes inherit it.
    os.environ["LETHE_KEY_DIR"] = str(path / "keys")
    return path


@pytest.fixture(scope="session")
def database_url(data_dir: Path) -> str:
    """The embedded PostgreSQL shared by the whole run (stopped at interpreter exit by pgserver)."""
    return start_embedded_postgres(data_dir)


def make_settings(data_dir: Path, database_url: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "data_dir": data_dir,
        "database_url": database_url,
        "model_cache_dir": MODEL_CACHE,
        "bootstrap_api_key": BOOTSTRAP_KEY,
        "bootstrap_webhook_secret": WEBHOOK_SECRET,
        "log_json": True,
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg, arg-type]


class LiveServer:
    """uvicorn serving an app in a thread with its own event loop, like a separate process would."""

    def __init__(self, settings: Settings, engine: KVEngine | None = None) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.app = create_app(settings, engine=engine)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_config=None, lifespan="on")
        self.server = uvicorn.Server(config)
        self._poll = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()), daemon=True)

    def start_without_waiting(self) -> None:
        self.thread.start()

    def wait_listening(self, client: httpx.Client, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                client.get("/healthz")
                return
            except httpx.TransportError:
                self._poll.wait(0.1)
        raise RuntimeError("the test server is not listening")

    def start(self, ready_timeout: float = 300) -> None:
        self.thread.start()
        with httpx.Client(base_url=self.base_url, timeout=5) as client:
            deadline = time.monotonic() + ready_timeout
            while time.monotonic() < deadline:
                if not self.thread.is_alive():
                    raise RuntimeError("the test server exited during startup")
                try:
                    if client.get("/readyz").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                self._poll.wait(0.2)  # polling readiness, as a client would
        raise RuntimeError("the test server did not become ready")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)


@pytest.fixture(scope="session")
def live_server(data_dir: Path, database_url: str) -> Iterator[LiveServer]:
    server = LiveServer(make_settings(data_dir, database_url))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def override_service(live_server: LiveServer) -> Iterator[OverrideService]:
    """`override_service(get_sessions, "sessions", session_lease_s=1.0)`: for this test, the live app's route
    dependency answers with `Container.services.<service>` of the live container rebuilt with `settings` changed
    (tests/support.py `rewired`: the same database, engine and handles, a knob turned). Every dependency it
    overrides is given back to the app after the test."""
    overrides = live_server.app.dependency_overrides
    overridden: list[Callable[..., Any]] = []

    def override(dependency: Callable[..., Any], service: str, **settings: Any) -> None:
        def rewired_service(container: ContainerDep) -> Any:
            return getattr(rewired(container, **settings).services, service)

        assert dependency not in overrides, f"{dependency.__name__} is overridden already"
        overrides[dependency] = rewired_service
        overridden.append(dependency)

    yield override
    for dependency in overridden:
        overrides.pop(dependency, None)


@pytest.fixture
def client(live_server: LiveServer) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {BOOTSTRAP_KEY}"}
    with httpx.Client(base_url=live_server.base_url, headers=headers, timeout=120) as c:
        yield c


@pytest.fixture
def anon(live_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live_server.base_url, timeout=120) as c:
        yield c


@pytest.fixture(scope="session")
def other_tenant_key(live_server: LiveServer, database_url: str) -> str:
    """An API key of a second tenant on the same database, made the way `lethe tenant create` makes one.

    Depends on the live server so the schema is migrated first."""
    return new_tenant_key(database_url, "other")


@pytest.fixture
def fresh_tenant(live_server: LiveServer, database_url: str) -> Iterator[httpx.Client]:
    """An HTTP client of a tenant of its own, made for the test: what it lists or searches is what the test made."""
    key = new_tenant_key(database_url, "fresh")
    with httpx.Client(base_url=live_server.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as c:
        yield c


@pytest.fixture
def other_tenant(live_server: LiveServer, other_tenant_key: str) -> Iterator[httpx.Client]:
    """An HTTP client authenticated as the second tenant."""
    with httpx.Client(base_url=live_server.base_url, headers={"Authorization": f"Bearer {other_tenant_key}"},
                      timeout=120) as c:
        yield c
