"""`lethe keys status | rotate | verify` and the key store's identity, against the run's real PostgreSQL and local
key store: the database records the store it was sealed with and a process pointed at another refuses to start
(the app's lifespan, a real `lethe serve`, the commands); a pending shred shows until `rotate` settles it; `verify`
counts what opens, what reads as erased, and fails on a tampered ciphertext or a key missing from the store.

Each test works in a tenant of its own (`--tenant`), so what other tests leave in the shared database (a ciphertext
moved on purpose, tests/memory/test_memory_at_rest.py) is not counted here. SQL writes only where an attacker with
the database, or a restored backup, would.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import multiprocessing
import os
import signal
import struct
import subprocess
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from typer.testing import CliRunner, Result

from app.cli import cli
from app.container import build_sealer
from app.db.database import Database
from app.db.embedded import start_embedded_postgres
from app.db.migrate import upgrade_to_head_async
from app.forget.repositories import jobs as jobs_repo
from app.ids import new_id
from app.keys.errors import Erased
from app.keys.factory import build_keyring
from app.keys.identity import KeyStoreMismatch
from app.keys.local import LocalProvider
from app.main import create_app
from app.memory.service import MemoryService
from app.tenants.service import TenantService
from bench.serve import LETHE, ROOT, serve_env
from tests.conftest import make_settings
from tests.keys import workers
from tests.support import free_port, sql

T = TypeVar("T")
SPAWN = multiprocessing.get_context("spawn")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def _lethe(database_url: str, *args: str, **env: str) -> Result:
    return CliRunner().invoke(cli, ["keys", *args], env={"LETHE_DATABASE_URL": database_url, **env})


def _new_tenant(database_url: str) -> tuple[str, str]:
    """A tenant of the caller's own: (id, name)."""
    name = "keys-" + uuid.uuid4().hex[:10]

    async def create() -> str:
        await upgrade_to_head_async(database_url)
        db = Database(database_url, pool_size=1)
        try:
            tenant_id, _ = await TenantService(db).create_tenant(name)
        finally:
            await db.close()
        return tenant_id

    return _run(create()), name


@pytest.fixture
def tenant(database_url: str) -> tuple[str, str]:
    return _new_tenant(database_url)


@pytest.fixture(scope="module")
def quiet_database_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A database no server runs on, for the test that needs a shred to stay pending until its own process takes it:
    the forget worker of a server on the run's database retries every pending shred each second, and would settle
    it first (stopped with the embedded PostgreSQL at exit)."""
    return start_embedded_postgres(tmp_path_factory.mktemp("keys-quiet"))


def _memory(database_url: str, data_dir: Path, tenant_id: str, writes: list[tuple[str, Any, int]]) -> None:
    """Writes through the memory service (sealed as the server seals them): (key, value, base version)."""

    async def run() -> None:
        db = Database(database_url, pool_size=1)
        try:
            memory = MemoryService(db, build_sealer(make_settings(data_dir, database_url), db, TenantService(db)))
            for key, value, base in writes:
                await memory.write(tenant_id, "ns", key, value=value, source="user", base_version=base)
        finally:
            await db.close()

    _run(run())


def _leaf(database_url: str, tenant_id: str, key: str) -> int:
    [row] = sql(database_url, "SELECT leaf FROM memory_records WHERE tenant_id = $1 AND key = $2", tenant_id, key)
    leaf: int = row["leaf"]
    return leaf


def _verified(database_url: str, name: str) -> tuple[int, dict[str, Any]]:
    result = _lethe(database_url, "verify", "--tenant", name, "--json")
    found = json.loads(result.stdout)
    return result.exit_code, {t["table"]: t for t in found["tables"]}


def test_the_database_records_its_key_store_and_a_process_with_another_refuses_to_start(
    database_url: str, data_dir: Path, tmp_path: Path
) -> None:
    assert _lethe(database_url, "status", "--json").exit_code == 0  # records the store if nobody did yet
    [row] = sql(database_url, "SELECT identity, provider FROM key_store")
    ours = LocalProvider(Path(os.environ["LETHE_KEY_DIR"])).identity()
    assert (row["identity"], row["provider"]) == (ours, "local")

    other = tmp_path / "other-keys"  # a wiped or swapped key store: it makes an identity of its own
    app = create_app(make_settings(data_dir, database_url, key_dir=other))

    async def start() -> None:
        async with app.router.lifespan_context(app):
            pass

    with pytest.raises(KeyStoreMismatch) as refused:
        _run(start())
    theirs = LocalProvider(other).identity()
    assert f"sealed with key store {ours} (local)" in str(refused.value)
    assert f"LETHE_KEY_DIR={other} points at key store {theirs}" in str(refused.value)
    assert not list(other.glob("*/*.cover"))  # it wrote no cover there

    for http_workers in ("1", "2"):  # uvicorn's lifespan, and the supervisor of several workers before it starts any
        served = subprocess.run(
            [*LETHE, "serve"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
            env=serve_env(tmp_path / "data", LETHE_DATABASE_URL=database_url, LETHE_KEY_DIR=str(other),
                          LETHE_PORT=str(free_port()), LETHE_HTTP_WORKERS=http_workers),
        )
        assert served.returncode != 0 and f"points at key store {theirs}" in served.stdout + served.stderr

    command = _lethe(database_url, "verify", LETHE_KEY_DIR=str(other))
    assert command.exit_code == 1 and "was sealed with key store" in command.stderr
    [again] = sql(database_url, "SELECT identity FROM key_store")
    assert again["identity"] == ours  # the first store stays the one recorded


@contextlib.contextmanager
def _shreds_held(tenant_id: str) -> Iterator[None]:
    """Holds the tenant's key store lock: a forget worker of a server sharing the run's database (its retry of every
    pending shred, each second) waits instead of settling the shred this test wants to see pending."""
    directory = Path(os.environ["LETHE_KEY_DIR"]) / tenant_id
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _status(database_url: str, name: str) -> dict[str, Any]:
    result = _lethe(database_url, "status", "--tenant", name, "--json")
    assert result.exit_code == 0, result.output
    [line] = json.loads(result.stdout)["tenants"]
    found: dict[str, Any] = line
    return found


def test_status_shows_a_pending_shred_until_rotate_settles_it(
    database_url: str, data_dir: Path, tenant: tuple[str, str]
) -> None:
    tenant_id, name = tenant
    _memory(database_url, data_dir, tenant_id, [("city", "Ghent", 0)])
    leaf = _leaf(database_url, tenant_id, "city")
    assert _status(database_url, name)["pending_shreds"] == 0

    with _shreds_held(tenant_id):
        _queue_pending(database_url, tenant_id, [leaf])
        line = _status(database_url, name)
        text = _lethe(database_url, "status", "--tenant", name).stdout
    assert line["pending_shreds"] == 1 and 0 <= line["oldest_pending_s"] < line["horizon_s"]
    assert (line["shards"], line["present"], line["damaged"], line["overdue"]) == (1, 1, 0, False)
    assert f"{name} ({tenant_id}):" in text and "1 pending shred(s), oldest" in text

    rotated = _lethe(database_url, "rotate", "--json")
    assert rotated.exit_code == 0, rotated.output
    assert json.loads(rotated.stdout)["pending"] == 0
    assert _status(database_url, name)["pending_shreds"] == 0
    with pytest.raises(Erased):
        _run(build_keyring(make_settings(data_dir, database_url)).key(tenant_id, leaf))
    again = _lethe(database_url, "rotate")
    assert again.exit_code == 0 and "0 pending shred(s) completed" in again.stdout  # idempotent


def _queue_pending(database_url: str, tenant_id: str, leaves: list[int]) -> None:
    """A forget's job whose shred the provider refused: recorded, never settled."""

    async def run() -> None:
        db = Database(database_url, pool_size=1)
        try:
            async with db.pg() as conn:
                # Nothing of this job is content (a memory target, no reason): nothing to seal, no Sealer needed.
                await jobs_repo.queue(conn, None, id=new_id("fgt"), tenant_id=tenant_id, strategy="selective_replay",
                                      target={"memory": "city"}, reason=None, receipt={}, finished=True,
                                      shred_leaves=leaves)
        finally:
            await db.close()

    _run(run())


@pytest.mark.parametrize("step", ["cover-written", "cover-switched", "cover-destroyed"])
def test_a_rotate_killed_at_any_step_leaves_verify_clean_and_a_rerun_finishes(
    quiet_database_url: str, data_dir: Path, step: str
) -> None:
    database_url = quiet_database_url
    tenant_id, name = _new_tenant(database_url)
    _memory(database_url, data_dir, tenant_id, [("city", "Ghent", 0), ("diet", "vegan", 0)])
    leaf = _leaf(database_url, tenant_id, "city")
    _queue_pending(database_url, tenant_id, [leaf])
    keys = os.environ["LETHE_KEY_DIR"]
    reached = SPAWN.Event()
    child = SPAWN.Process(target=workers.rotate_until, args=(database_url, keys, step, reached))
    child.start()
    assert reached.wait(120), "the rotation never reached the step"
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert child.exitcode == -signal.SIGKILL

    code, tables = _verified(database_url, name)  # the survivor opens; the shredded leaf is erased or not yet
    assert code == 0 and tables["memory_records"]["ok"] >= 1 and tables["memory_records"]["tampered"] == 0
    rotated = _lethe(database_url, "rotate", "--json")
    assert rotated.exit_code == 0 and json.loads(rotated.stdout)["pending"] == 0
    code, tables = _verified(database_url, name)
    assert code == 0 and (tables["memory_records"]["ok"], tables["memory_records"]["erased"]) == (1, 1)
    assert sorted(p.name for p in (Path(keys) / tenant_id).iterdir()) == [".lock", f"{0:010d}.cover"]


def test_verify_counts_what_opens_and_a_shredded_live_row_as_erased(
    database_url: str, data_dir: Path, tenant: tuple[str, str]
) -> None:
    tenant_id, name = tenant
    _memory(database_url, data_dir, tenant_id, [("city", "Ghent", 0), ("city", "Bruges", 1), ("diet", "vegan", 0)])
    code, tables = _verified(database_url, name)
    assert code == 0
    assert [tables["memory_records"][o] for o in ("ok", "erased", "missing", "tampered")] == [2, 0, 0, 0]
    assert [tables["memory_versions"][o] for o in ("ok", "erased", "missing", "tampered")] == [3, 0, 0, 0]

    # What a backup restored from before a forget holds: live rows whose leaf is punctured. Normal: exit 0.
    keyring = build_keyring(make_settings(data_dir, database_url))
    _run(keyring.shred(tenant_id, [_leaf(database_url, tenant_id, "city")]))
    code, tables = _verified(database_url, name)
    assert code == 0
    assert (tables["memory_records"]["ok"], tables["memory_records"]["erased"]) == (1, 1)
    assert (tables["memory_versions"]["ok"], tables["memory_versions"]["erased"]) == (1, 2)
    assert tables["memory_records"]["examples"]["erased"] == [f"{tenant_id}/ns/city/value_sealed"]


def test_verify_fails_on_a_moved_ciphertext_and_on_a_key_missing_from_the_store(
    database_url: str, data_dir: Path, tenant: tuple[str, str]
) -> None:
    tenant_id, name = tenant
    _memory(database_url, data_dir, tenant_id, [("a", "one", 0), ("b", "two", 0), ("c", "three", 0)])
    sql(database_url, """
        UPDATE memory_records SET value_sealed = (SELECT value_sealed FROM memory_records
                                                   WHERE tenant_id = $1 AND key = 'a'),
                                  leaf = (SELECT leaf FROM memory_records WHERE tenant_id = $1 AND key = 'a')
         WHERE tenant_id = $1 AND key = 'b'
    """, tenant_id)
    code, tables = _verified(database_url, name)
    assert code == 1
    assert (tables["memory_records"]["ok"], tables["memory_records"]["tampered"]) == (2, 1)
    assert tables["memory_records"]["examples"]["tampered"] == [f"{tenant_id}/ns/b/value_sealed"]
    text = _lethe(database_url, "verify", "--tenant", name)
    assert text.exit_code == 1 and "FAILED" in text.stdout

    # A leaf whose shard the key store never held (content sealed under a store since lost): missing, not erased.
    far = 1 << 40
    [row] = sql(database_url, "SELECT value_sealed FROM memory_records WHERE tenant_id = $1 AND key = 'c'", tenant_id)
    moved = bytes(row["value_sealed"])
    relabelled = moved[:1] + struct.pack(">Q", far) + moved[9:]
    sql(database_url, "UPDATE memory_records SET value_sealed = $2, leaf = $3 WHERE tenant_id = $1 AND key = 'c'",
        tenant_id, relabelled, far)
    code, tables = _verified(database_url, name)
    assert code == 1 and tables["memory_records"]["missing"] == 1
    assert not (Path(os.environ["LETHE_KEY_DIR"]) / tenant_id / f"{far >> 12:010d}.cover").exists()  # never created


def test_a_sweep_punctures_a_tenants_pending_shreds_in_one_write_per_shard(
    quiet_database_url: str, tmp_path: Path
) -> None:
    """Four forgets whose shreds the provider refused (it was down), three of them in one shard: the worker's sweep
    settles all four with one write per shard, and each job is marked with the leaves it recorded."""
    from app.forget.shredding import Shredder
    from app.keys import tree
    from app.keys.content import Sealer
    from app.keys.keyring import Keyring
    from app.keys.leaves import Leaves

    database_url = quiet_database_url
    tenant_id, _ = _new_tenant(database_url)
    recorded = [[3], [5, 6], [9], [tree.LEAVES + 1]]
    for leaves in recorded:
        _queue_pending(database_url, tenant_id, leaves)
    writes: list[int] = []

    class Counting(LocalProvider):
        def write(self, tenant: str, shard: int, nodes: tree.Nodes, expected: int) -> Any:
            if tenant == tenant_id:
                writes.append(shard)
            return super().write(tenant, shard, nodes, expected)

    keys = tmp_path / "keys"

    async def sweep() -> int:
        db = Database(database_url, pool_size=1)
        try:
            sealer = Sealer(Keyring(Counting(keys)), Leaves(TenantService(db).reserve_leaves))
            return await Shredder(db, sealer).sweep()
        finally:
            await db.close()

    assert _run(sweep()) >= len(recorded)  # other tests' tenants on this database may have had some pending too
    assert sorted(writes) == [0, 1]
    jobs = sql(database_url, "SELECT shred_leaves, shredded_at FROM forget_jobs WHERE tenant_id = $1", tenant_id)
    assert sorted(list(j["shred_leaves"]) for j in jobs) == sorted(recorded)
    assert all(j["shredded_at"] is not None for j in jobs)
    keyring = Keyring(LocalProvider(keys))
    for leaf in (3, 5, 6, 9, tree.LEAVES + 1):
        with pytest.raises(Erased):
            _run(keyring.key(tenant_id, leaf))
    _run(keyring.key(tenant_id, 4))  # a neighbour nobody forgot still derives
