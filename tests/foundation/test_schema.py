"""Migrations create exactly the models, run concurrently without harm, and name every constraint."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from app.db.embedded import start_embedded_postgres, to_async_url
from app.db.migrate import upgrade_to_head_async
from app.db.models import Base


@pytest.fixture(scope="module")
def fresh_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A database of its own, so this module sees migrations from an empty schema."""
    return start_embedded_postgres(tmp_path_factory.mktemp("schema-db"))


def test_concurrent_migrate_processes_apply_once(tmp_path: Path) -> None:
    """Several `lethe migrate` processes at once (as replicas starting together): one migrates, the rest wait."""
    env = {**os.environ, "LETHE_DATA_DIR": str(tmp_path)}
    env.pop("LETHE_DATABASE_URL", None)
    procs = [
        subprocess.Popen([sys.executable, "-m", "app", "migrate"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs

    async def check() -> tuple[list[str], str | None]:
        engine = create_async_engine(to_async_url(start_embedded_postgres(tmp_path)))
        async with engine.connect() as conn:
            versions = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalars().all()
            ext = (await conn.execute(text("SELECT extversion FROM pg_extension WHERE extname='vector'"))).scalar()
        await engine.dispose()
        return list(versions), ext

    versions, ext = asyncio.run(check())
    assert len(versions) == 1 and ext is not None


async def test_models_match_migrations(fresh_url: str) -> None:
    await upgrade_to_head_async(fresh_url)
    engine = create_async_engine(to_async_url(fresh_url))
    async with engine.connect() as conn:
        diff = await conn.run_sync(
            lambda sync: compare_metadata(MigrationContext.configure(sync, opts={"compare_type": True}), Base.metadata)
        )
    await engine.dispose()
    assert diff == [], f"models and migrations differ: {diff}"


async def test_every_constraint_follows_the_naming_convention(fresh_url: str) -> None:
    await upgrade_to_head_async(fresh_url)
    engine = create_async_engine(to_async_url(fresh_url))
    async with engine.connect() as conn:
        rows = (await conn.execute(text(
            "SELECT conname, contype::text FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace "
            "WHERE n.nspname = 'public' AND conrelid::regclass::text <> 'alembic_version'"
        ))).all()
    await engine.dispose()
    prefixes = {"p": "pk_", "u": "uq_", "f": "fk_", "c": "ck_"}
    bad = [name for name, kind in rows if not name.startswith(prefixes[kind])]
    assert rows and not bad, bad


def test_migrations_form_one_linear_chain() -> None:
    versions = Path(__file__).resolve().parents[2] / "migrations" / "versions"
    revisions: dict[str, str | None] = {}
    for path in versions.glob("*.py"):
        source = path.read_text()
        rev = re.search(r"^revision: str = ['\"]([^'\"]+)['\"]", source, re.M)
        down = re.search(r"^down_revision: str \| None = (None|['\"][^'\"]+['\"])", source, re.M)
        assert rev and down, path
        revisions[rev.group(1)] = None if down.group(1) == "None" else down.group(1).strip("'\"")
    roots = [r for r, d in revisions.items() if d is None]
    assert len(roots) == 1
    children = [d for d in revisions.values() if d is not None]
    assert len(children) == len(set(children)), "two migrations share a parent: the chain has branched"
