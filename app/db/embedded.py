"""The embedded PostgreSQL (the `pgserver` package: PostgreSQL 16 with pgvector) for the one-command setup.

pgserver shares one server per data directory between processes (it lists its holders' pids in the data directory)
and stops it when the last one exits, so two `lethe serve` processes on one data directory talk to the same
database. Two gaps are closed here: a holder that died without running its exit handlers (SIGKILL, OOM) stays
listed forever, so nobody would ever be "last" again and the server would outlive every process; dead holders are
dropped whenever a process attaches or lets go. (`lethe serve` turns SIGTERM into a normal exit, see cli.py, so its
exit handlers run.)
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import warnings
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def start_embedded_postgres(data_dir: Path) -> str:
    """Start (or attach to) the embedded server under `data_dir/pg`; return its asyncpg URL. Blocking."""
    # pgserver's lock lives under XDG_RUNTIME_DIR; its fallback to /tmp/runtime-<uid> is fine, the warning is noise.
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
    try:
        import pgserver
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            "LETHE_DATABASE_URL is unset and the embedded PostgreSQL is not installed: "
            "install the `embedded` extra (make run does) or point LETHE_DATABASE_URL at PostgreSQL with pgvector"
        ) from exc
    data_dir.mkdir(parents=True, exist_ok=True)
    # Processes starting together on one data directory (replicas, `lethe migrate` beside `lethe serve`) take turns:
    # pgserver's initdb of a new directory is not safe against a second process creating the same one.
    pgdata = data_dir.resolve() / "pg"
    with open(data_dir / ".pg-start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _drop_dead_holders(pgdata)
        server = pgserver.get_server(pgdata, cleanup_mode="stop")  # type: ignore[attr-defined]
    if server not in _held:
        _held.append(server)
        # atexit runs last-registered first: this runs before pgserver's own handler, which it makes a no-op.
        atexit.register(release_embedded_postgres, server)
    uri: str = server.get_uri()
    log.info("embedded postgres ready", extra={"pgdata": str(data_dir / "pg")})
    return uri


_held: list[Any] = []


def release_embedded_postgres(server: Any) -> None:
    """Let go of the server; the last live holder stops it (`pg_ctl stop`, waiting for the shutdown)."""
    _drop_dead_holders(server.pgdata)
    server.cleanup()


def _drop_dead_holders(pgdata: Path) -> None:
    """Remove the pids of processes that no longer exist from pgserver's holder list (under its lock)."""
    from pgserver.postgres_server import PostgresServer

    listing = pgdata / ".handle_pids.json"
    with PostgresServer._lock:
        if not listing.exists():
            return
        pids: list[int] = json.loads(listing.read_text() or "[]")
        alive = [pid for pid in pids if _alive(pid)]
        if alive != pids:
            log.info("embedded postgres: dropped %d dead holder(s)", len(pids) - len(alive))
            listing.write_text(json.dumps(alive))


def _alive(pid: int) -> bool:
    import psutil

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def to_async_url(url: str) -> str:
    """Normalise a libpq-style URL to the SQLAlchemy asyncpg dialect."""
    for prefix in ("postgresql+asyncpg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+asyncpg://" + url.removeprefix(prefix)
    raise ValueError("database URL must start with postgresql://")
