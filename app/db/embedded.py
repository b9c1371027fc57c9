"""The embedded PostgreSQL (the `pgserver` package: PostgreSQL 16 with pgvector) for the one-command setup.

pgserver shares one server per data directory between processes (it counts handles by pid) and stops it when
the last one exits, so two `lethe serve` processes on one data directory talk to the same database.
"""

from __future__ import annotations

import fcntl
import logging
import warnings
from pathlib import Path

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
    with open(data_dir / ".pg-start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        server = pgserver.get_server(  # type: ignore[attr-defined]
            data_dir.resolve() / "pg", cleanup_mode="stop")
    uri: str = server.get_uri()
    log.info("embedded postgres ready", extra={"pgdata": str(data_dir / "pg")})
    return uri


def to_async_url(url: str) -> str:
    """Normalise a libpq-style URL to the SQLAlchemy asyncpg dialect."""
    for prefix in ("postgresql+asyncpg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+asyncpg://" + url.removeprefix(prefix)
    raise ValueError("database URL must start with postgresql://")
