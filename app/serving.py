"""`lethe serve` with several HTTP workers: one engine process behind them, one command in front.

    LETHE_HTTP_WORKERS=2 lethe serve

This process (the supervisor) prepares what must happen once: the embedded PostgreSQL (it owns it and stops it on
exit), migrations, the bootstrap tenant. Then it starts, and starts again any that dies:

- one **engine process** (`lethe engine-process`, app/engine/process/server.py): the model, the sessions' KV caches
  and the embedder, and nothing else, on a private Unix socket (not with `LETHE_ENGINE=vllm-remote`: the vLLM fleet
  is the engine, and every worker calls it directly);
- `LETHE_HTTP_WORKERS` **HTTP workers** (`lethe http-worker`) on the public port. Each is the whole app — every
  route, authentication, session leases, the database, a forget worker — and reaches the engine process through an
  engine client (app/engine/process/client.py) for model work only: the boundary sits under the engine interface,
  as vLLM's API servers talk to one engine core, so the model is loaded once and there is no list of routes to keep.

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

from app.db.database import Database, resolve_database_url
from app.db.migrate import upgrade_to_head_async
from app.settings import EngineKind, Settings

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
    if not has_engine_process(settings):
        env.pop(ENGINE_SOCKET_ENV)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: stop.set())
    engine = [KeptAlive("engine-process", env)] if has_engine_process(settings) else []
    children = [*engine, *(KeptAlive("http-worker", env) for _ in range(settings.http_workers))]
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
    """What the processes must not race on: the database (started here when embedded), migrations, bootstrap; and the
    key store checked once here, so a wrong one fails `lethe serve` instead of every worker it would restart."""
    from app.keys.factory import build_provider
    from app.keys.identity import check_key_store
    from app.tenants.service import TenantService

    url = await resolve_database_url(settings)
    await upgrade_to_head_async(url)
    db = Database(url, pool_size=1)
    try:
        await check_key_store(db, build_provider(settings), settings)
        await TenantService(db).bootstrap(settings)
    finally:
        await db.close()
    return url


def has_engine_process(settings: Settings) -> bool:
    """Whether the workers share an engine process: not when the engine is a vLLM fleet they call themselves."""
    return settings.engine != EngineKind.VLLM_REMOTE


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
    for model work and serve everything else; a restarted one rebuilds a session's cache from its stored log."""

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
    """The engine process (`lethe engine-process`): the engine and the embedder on the supervisor's Unix socket."""
    die_with_parent()
    socket_path = Path(os.environ[ENGINE_SOCKET_ENV])
    socket_path.unlink(missing_ok=True)  # a previous engine process's, if it died
    asyncio.run(_serve_engine(settings, socket_path))


async def _serve_engine(settings: Settings, socket_path: Path) -> None:
    from app.embeddings import MiniLMEmbedder
    from app.engine.factory import build_engine  # heavy imports (torch) only here
    from app.engine.model_store import resolve_model
    from app.engine.process.server import EngineServer

    engine = build_engine(settings)
    server = EngineServer(engine, MiniLMEmbedder())

    async def load() -> None:
        try:
            await engine.start()
            resolved = await asyncio.to_thread(resolve_model, settings.model, settings.resolved_model_cache_dir)
            server.model_dir = resolved.path  # last: a worker's hello says "ready" from here on
            log.info("engine process ready", extra={"engine": engine.name, "model": engine.model_id})
        except Exception as exc:  # reported to the workers by hello; they answer 503 and keep serving the rest
            server.error = f"{type(exc).__name__}: {exc}"
            log.exception("engine failed to start")

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    listening = await server.serve(socket_path)  # at once: workers learn "loading" instead of "unreachable"
    loading = asyncio.create_task(load(), name="engine-load")
    try:
        await stop.wait()
    finally:
        listening.close()
        server.disconnect_all()
        loading.cancel()
        await asyncio.gather(loading, return_exceptions=True)
        await engine.close()
        log.info("engine process stopped")


def run_http_worker(settings: Settings) -> None:
    """An HTTP worker (`lethe http-worker`): the whole app on its own SO_REUSEPORT socket on the public port."""
    from app.main import create_app

    die_with_parent()
    socket_path = os.environ.get(ENGINE_SOCKET_ENV)
    config = uvicorn.Config(
        create_app(settings, engine_process=Path(socket_path) if socket_path else None, prepared=True),
        log_config=None, proxy_headers=False, timeout_graceful_shutdown=settings.shutdown_grace_s,
        timeout_keep_alive=settings.keep_alive_s,
    )
    uvicorn.Server(config).run(sockets=[reuseport_socket(settings.host, settings.port)])
