"""`lethe migrate` and the migration step of `lethe serve`: Alembic upgrade to head, programmatically."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from alembic import command
from alembic.config import Config

from app.db.embedded import to_async_url


def migrations_dir() -> Path:
    """`migrations/` beside the package in a checkout or editable install, else in the working directory."""
    here = Path(__file__).resolve().parents[2] / "migrations"
    return here if here.is_dir() else Path.cwd() / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    # ConfigParser interpolation would read '%' in a password as a placeholder.
    cfg.set_main_option("sqlalchemy.url", to_async_url(url).replace("%", "%%"))
    return cfg


# Alembic keeps its running context in module globals, so one process migrates from one thread at a time;
# processes exclude each other with an advisory lock in migrations/env.py.
_in_process = threading.Lock()


def upgrade_to_head(url: str) -> None:
    """Blocking; env.py runs its own event loop, so call this from a thread when a loop is running."""
    with _in_process:
        command.upgrade(alembic_config(url), "head")


async def upgrade_to_head_async(url: str) -> None:
    await asyncio.to_thread(upgrade_to_head, url)
