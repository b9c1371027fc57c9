"""`lethe serve` with several HTTP workers: one engine process behind them, one command in front.

    LETHE_HTTP_WORKERS=2 lethe serve

This process (the supervisor) prepares what must happen once: the embedded PostgreSQL (it owns it and stops it on
exit), migrations, the bootstrap tenant. Then it starts, and starts again any that dies:

- one **engine process** (`lethe engine-process`): the whole app — the model, the sessions' KV caches, the forget
  worker — listening on a private Unix socket;
- `LETHE_HTTP_WORKERS` **HTTP workers** (`lethe http-worker`) on the public port. A worker serves the memory API,
  health and metrics itself and forwards the rest to the engine process (app/api/forwarding.py), so the model is
  loaded once and a session's turns always find its warm cache.

Each worker listens on a socket of its own bound with SO_REUSEPORT, so the kernel spreads connections over the
workers evenly. (One shared listening socket, as uvicorn's own `--workers` does, lets whichever worker wakes first
accept a whole burst of new connections: 32 clients connecting at once ended up mostly on one worker, and since
keep-alive connections stay where they landed, that worker ran at 100 % while the other idled.) The supervisor holds
a bound, never-listening socket of the same group, so a port already in use fails `lethe serve` at once.

Metrics are gathered across the processes (prometheus_client's multiprocess mode), so `/metrics` on any worker
answers for all of them. Every child asks the kernel to stop it when the supervisor dies (PR_SET_PDEATHSIG), so a
`kill -9` of `lethe serve` leaves no worker behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import uvicorn

from app.db.migrate import upgrade_to_head_async
from app.db.session import Database, resolve_database_url
from app.settings import Settings

log = logging.getLogger(__name__)

ENGINE_SOCKET_ENV = "LETHE_ENGINE_PROCESS_SOCKET"  # set by the supervisor for its children; not a user setting
_PR_SET_PDEATHSIG = 1
_RESTART_DELAY_S = 1.0  # a child that cannot start at all is not restarted in a tight loop


def serve_with_workers(settings: Settings) -> None:
    url = asyncio.run(_prepare(settings))
    holder = reuseport_socket(settings.host, settings.port)  # fails here, once, if the port is taken
    run_dir = Path(tempfile.mkdtemp(prefix="lethe-run-"))  # short: a Unix socket path must fit in 108 bytes
    metrics_dir = run_dir / "metrics"
    metrics_dir.mkdir()
    env = {
        **os.environ, "LETHE_DATABASE_URL": url, ENGINE_SOCKET_ENV: str(run_dir / "engine.sock"),
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
    }
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: stop.set())
    workers = [KeptAlive("http-worker", env) for _ in range(settings.http_workers)]
    children = [KeptAlive("engine-process", env), *workers]
    log.info("lethe serving", extra={"http_workers": settings.http_workers, "port": settings.port})
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for child in children:  # workers and engine stop together; each finishes its requests within the grace
            child.signal_stop()
        for child in children:
            child.wait_stopped(settings.shutdown_grace_s + 10)
        holder.close()
        shutil.rmtree(run_dir, ignore_errors=True)


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


def reuseport_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SystemExit(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


class KeptAlive:
    """A `lethe <command>` child, started again if it dies. While the engine process is down the workers answer 503
    for engine routes and keep serving memory; a restarted one rebuilds a session's cache from its stored log."""

    def __init__(self, command: str, env: dict[str, str]) -> None:
        self.command, self.env = command, env
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.process = self._start()
        threading.Thread(target=self._keep_alive, name=f"keeper-{command}", daemon=True).start()

    def _start(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "app", self.command], env=self.env)

    def _keep_alive(self) -> None:
        while True:
            code = self.process.wait()
            if self._stopping.wait(_RESTART_DELAY_S):
                return
            with self._lock:
                if self._stopping.is_set():
                    return
                log.error("child process exited; starting it again", extra={"child": self.command, "exit_code": code})
                self.process = self._start()

    def signal_stop(self) -> None:
        with self._lock:
            self._stopping.set()
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout_s: float) -> None:
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when its parent (the supervisor) dies; a no-op elsewhere."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def run_engine_process(settings: Settings) -> None:
    """The engine process: the whole app on the supervisor's Unix socket (`lethe engine-process`)."""
    from app.main import create_app

    die_with_parent()
    config = uvicorn.Config(
        create_app(settings, prepared=True), uds=os.environ[ENGINE_SOCKET_ENV], log_config=None, proxy_headers=False,
        timeout_graceful_shutdown=settings.shutdown_grace_s, timeout_keep_alive=settings.keep_alive_s,
    )
    uvicorn.Server(config).run()


def run_http_worker(settings: Settings) -> None:
    """An HTTP worker (`lethe http-worker`): its own SO_REUSEPORT socket on the public port."""
    from app.main import create_app

    die_with_parent()
    config = uvicorn.Config(
        create_app(settings, engine_process=Path(os.environ[ENGINE_SOCKET_ENV])), log_config=None,
        proxy_headers=False, timeout_graceful_shutdown=settings.shutdown_grace_s,
        timeout_keep_alive=settings.keep_alive_s,
    )
    uvicorn.Server(config).run(sockets=[reuseport_socket(settings.host, settings.port)])
