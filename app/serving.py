"""`lethe serve` with several HTTP workers: one engine process behind them, one command in front.

    LETHE_HTTP_WORKERS=2 lethe serve

This process (the supervisor) prepares what must happen once: the embedded PostgreSQL (it owns it and stops it on
exit), migrations, the bootstrap tenant. Then it starts

- one **engine process** (`lethe engine-process`): the whole app — the model, the sessions' KV caches, the forget
  worker — listening on a private Unix socket;
- `LETHE_HTTP_WORKERS` **HTTP workers** sharing the public port (uvicorn's supervisor: it restarts a worker that
  dies). A worker serves the memory API, health and metrics itself and forwards the rest to the engine process
  (app/api/forwarding.py), so the model is loaded once and a session's turns always find its warm cache.

Metrics are gathered across the processes (prometheus_client's multiprocess mode), so `/metrics` on any worker
answers for all of them. Every child asks the kernel to stop it when the supervisor dies (PR_SET_PDEATHSIG): a
`kill -9` of `lethe serve` leaves no worker behind (the embedded PostgreSQL then stops when it sees its last holder
gone, app/db/embedded.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from app.db.migrate import upgrade_to_head_async
from app.db.session import Database, resolve_database_url
from app.settings import Settings, settings_from_env

log = logging.getLogger(__name__)

ENGINE_SOCKET_ENV = "LETHE_ENGINE_PROCESS_SOCKET"  # set by the supervisor for its children; not a user setting
_PR_SET_PDEATHSIG = 1


def serve_with_workers(settings: Settings) -> None:
    url = asyncio.run(_prepare(settings))
    run_dir = Path(tempfile.mkdtemp(prefix="lethe-run-"))  # short: a Unix socket path must fit in 108 bytes
    socket_path = run_dir / "engine.sock"
    metrics_dir = run_dir / "metrics"
    metrics_dir.mkdir()
    # The children inherit this environment: uvicorn spawns its workers from this process.
    os.environ.update({
        "LETHE_DATABASE_URL": url,
        ENGINE_SOCKET_ENV: str(socket_path),
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
    })
    engine = EngineProcess()
    try:
        uvicorn.run(
            "app.serving:http_worker_app", factory=True, workers=settings.http_workers, host=settings.host,
            port=settings.port, log_config=None, proxy_headers=False,
            timeout_graceful_shutdown=settings.shutdown_grace_s, timeout_keep_alive=settings.keep_alive_s,
        )
    finally:
        engine.stop(settings.shutdown_grace_s)
        shutil.rmtree(run_dir, ignore_errors=True)


class EngineProcess:
    """The engine process, started again if it dies (the workers answer 503 for engine routes meanwhile and keep
    serving memory). A restarted engine process rebuilds a session's cache from its stored log on its next turn."""

    def __init__(self) -> None:
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.process = self._start()
        threading.Thread(target=self._keep_alive, name="engine-keeper", daemon=True).start()

    @staticmethod
    def _start() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "app", "engine-process"])

    def _keep_alive(self) -> None:
        while not self._stopping.is_set():
            code = self.process.wait()
            with self._lock:
                if self._stopping.is_set():
                    return
                log.error("engine process exited; starting it again", extra={"exit_code": code})
                time.sleep(1)  # a process that cannot start at all is not restarted in a tight loop
                self.process = self._start()

    def stop(self, grace_s: float) -> None:
        with self._lock:
            self._stopping.set()
            process = self.process
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=grace_s + 10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def _prepare(settings: Settings) -> str:
    """What the processes must not race on: the database (started here when embedded), migrations, bootstrap."""
    from app.tenants.service import TenantService

    url = await resolve_database_url(settings)
    await upgrade_to_head_async(url)
    db = Database(url, pool_size=1)
    try:
        await TenantService(db).bootstrap(settings)
    finally:
        await db.close()
    return url


def die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when its parent (the supervisor) dies; a no-op elsewhere."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def run_engine_process(settings: Settings) -> None:
    """The engine process: the whole app on the supervisor's Unix socket (`lethe engine-process`)."""
    from app.main import create_app

    die_with_parent()
    socket_path = os.environ[ENGINE_SOCKET_ENV]
    uvicorn.run(
        create_app(settings, prepared=True), uds=socket_path, log_config=None, proxy_headers=False,
        timeout_graceful_shutdown=settings.shutdown_grace_s, timeout_keep_alive=settings.keep_alive_s,
    )


def http_worker_app() -> FastAPI:
    """uvicorn's factory in each HTTP worker."""
    from app.main import create_app

    die_with_parent()
    settings = settings_from_env()
    return create_app(settings, engine_process=Path(os.environ[ENGINE_SOCKET_ENV]))
