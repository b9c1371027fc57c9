"""The `local` provider with real files and real processes: racing writers keep each other's work, a process killed
at any step of a shred loses no surviving key, and a shred reaches every copy of the content."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import stat
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from app.keys import tree
from app.keys.envelope import Binding
from app.keys.errors import Erased, Tampered
from app.keys.keyring import Keyring
from app.keys.local import LocalProvider
from tests.keys import workers

T = TypeVar("T")
SPAWN = multiprocessing.get_context("spawn")
TENANT = "ten_a"


def _keys(directory: Path, tenant: str, leaves: range) -> dict[int, bytes | None]:
    """What a process that never saw these keys derives (no cache): None for an erased leaf."""
    keyring = Keyring(LocalProvider(directory))
    found: dict[int, bytes | None] = {}
    for leaf in leaves:
        try:
            found[leaf] = _run(keyring.key(tenant, leaf))
        except Erased:
            found[leaf] = None
    return found


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def _every_byte(directory: Path) -> bytes:
    return b"".join(path.read_bytes() for path in directory.rglob("*") if path.is_file())


def _seeds_of(directory: Path, tenant: str, shard: int) -> set[bytes]:
    cover = LocalProvider(directory).read(tenant, shard)
    assert cover is not None
    return set(cover.nodes.values())


def test_files_are_private_and_keys_stable(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    first = _keys(keys, TENANT, range(0, 3))
    assert first == _keys(keys, TENANT, range(0, 3))  # another process derives the same keys
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    assert stat.S_IMODE((keys / TENANT).stat().st_mode) == 0o700
    (cover,) = (keys / TENANT).glob("*.cover")
    assert stat.S_IMODE(cover.stat().st_mode) == 0o600


def test_the_store_has_one_identity(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    first = LocalProvider(keys).identity()
    assert len(first) == 32 and LocalProvider(keys).identity() == first
    assert stat.S_IMODE((keys / ".identity").stat().st_mode) == 0o600
    assert LocalProvider(tmp_path / "other").identity() != first  # a swapped key store is told apart


def test_shred_reaches_every_copy_and_keeps_the_rest(tmp_path: Path) -> None:
    """A copy of the ciphertexts taken before the forget (a backup) still opens for the control, never the target,
    and no file of the key store still holds a seed that derived the target."""
    keys = tmp_path / "keys"
    keyring = Keyring(LocalProvider(keys))
    target, control = Binding(TENANT, "memory_versions", "1", "value"), Binding(TENANT, "memory_versions", "2", "value")
    backup = {
        "target": _run(keyring.seal(4096 + 17, target, b"passport X1234567")),
        "control": _run(keyring.seal(4096 + 18, control, b"likes tea")),
    }
    old_seeds = _seeds_of(keys, TENANT, 1)
    _run(keyring.shred(TENANT, [4096 + 17]))

    with pytest.raises(Erased):
        _run(keyring.unseal(target, backup["target"]))  # this process dropped it at once
    fresh = Keyring(LocalProvider(keys))  # a restored backup served by a new process, same key store
    assert _run(fresh.unseal(control, backup["control"])) == b"likes tea"
    with pytest.raises(Erased):
        _run(fresh.unseal(target, backup["target"]))
    assert not any(seed in _every_byte(keys) for seed in old_seeds)
    assert not list((keys / TENANT).glob(".*.old")) and not list((keys / TENANT).glob(".*.tmp"))


def test_tenants_do_not_share_keys(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    a, b = _keys(keys, "ten_a", range(0, 4)), _keys(keys, "ten_b", range(0, 4))
    assert not set(a.values()) & set(b.values())
    keyring = Keyring(LocalProvider(keys))
    sealed = _run(keyring.seal(2, Binding("ten_a", "artifacts", "art_1", "text"), b"a's"))
    with pytest.raises(Tampered):  # the same leaf number in another tenant is another key
        _run(keyring.unseal(Binding("ten_b", "artifacts", "art_1", "text"), sealed))
    _run(Keyring(LocalProvider(keys)).shred("ten_a", range(0, 4)))
    assert _keys(keys, "ten_b", range(0, 4)) == b
    assert set(_keys(keys, "ten_a", range(0, 4)).values()) == {None}


def test_a_damaged_cover_is_loud_not_erased(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    _keys(keys, TENANT, range(0, 1))
    (cover,) = (keys / TENANT).glob("*.cover")
    cover.write_bytes(b"\0" * 64)
    with pytest.raises(Tampered):
        LocalProvider(keys).read(TENANT, 0)
    with pytest.raises(ValueError):
        LocalProvider(keys).read("../etc", 0)


def test_racing_creators_derive_the_same_key(tmp_path: Path) -> None:
    """Two processes both find the shard missing and both try to create it: one cover, one key."""
    barrier = SPAWN.Barrier(2)
    outs = [tmp_path / "one", tmp_path / "two"]
    children = [
        SPAWN.Process(target=workers.derive_after_barrier, args=(str(tmp_path / "keys"), TENANT, 5, barrier, str(o)))
        for o in outs
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(120)
        assert child.exitcode == 0
    assert outs[0].read_bytes() == outs[1].read_bytes() == _keys(tmp_path / "keys", TENANT, range(5, 6))[5]


def test_racing_shreds_keep_both_punctures(tmp_path: Path) -> None:
    """Two processes read the same cover, then both write: the loser reads again and punctures on top."""
    keys = tmp_path / "keys"
    before = _keys(keys, TENANT, range(0, 8))
    barrier = SPAWN.Barrier(2)
    children = [
        SPAWN.Process(target=workers.shred_after_barrier, args=(str(keys), TENANT, leaves, barrier))
        for leaves in ([1, 2], [5])
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(120)
        assert child.exitcode == 0
    after = _keys(keys, TENANT, range(0, 8))
    assert after == {leaf: None if leaf in (1, 2, 5) else key for leaf, key in before.items()}
    cover = LocalProvider(keys).read(TENANT, 0)
    assert cover is not None and cover.version == 3  # created, then one write per shred


@pytest.mark.parametrize("step", ["cover-written", "cover-switched", "cover-destroyed"])
def test_sigkill_at_each_step_loses_nothing(tmp_path: Path, step: str) -> None:
    keys = tmp_path / "keys"
    leaves = range(4096, 4096 + 64)
    before = _keys(keys, TENANT, leaves)
    old_seeds = _seeds_of(keys, TENANT, 1)
    target = [4096 + 10, 4096 + 11, 4096 + 40]
    reached = SPAWN.Event()
    child = SPAWN.Process(target=workers.shred_until, args=(str(keys), TENANT, target, step, reached))
    child.start()
    assert reached.wait(120), "the child never reached the step"
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert child.exitcode == -signal.SIGKILL

    survivors = {leaf: key for leaf, key in _keys(keys, TENANT, leaves).items() if leaf not in target}
    assert survivors == {leaf: key for leaf, key in before.items() if leaf not in target}
    # Run again, as the forget's retry does: the target is erased and nothing of the old cover is left anywhere.
    _run(Keyring(LocalProvider(keys)).shred(TENANT, target))
    after = _keys(keys, TENANT, leaves)
    assert after == {leaf: None if leaf in target else key for leaf, key in before.items()}
    assert not any(seed in _every_byte(keys) for seed in old_seeds)
    assert sorted(p.name for p in (keys / TENANT).iterdir()) == [".lock", f"{1:010d}.cover"]


def test_a_never_written_shard_shredded_stays_erased(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    _run(Keyring(LocalProvider(keys)).shred(TENANT, [3 * tree.LEAVES + 1]))
    found = _keys(keys, TENANT, range(3 * tree.LEAVES, 3 * tree.LEAVES + 3))
    assert found[3 * tree.LEAVES + 1] is None and None not in (found[3 * tree.LEAVES], found[3 * tree.LEAVES + 2])


def test_shreds_of_one_shard_at_once_share_writes_and_all_land(tmp_path: Path) -> None:
    """32 forgets of one shard at once in one process (as 32 clients deleting memory keys): the first writes its leaf,
    every shred queued meanwhile rides the next write, and none is lost. Racing each other instead, each would read
    the same cover and lose the compare-and-set to the others, again and again."""
    keys = tmp_path / "keys"
    before = _keys(keys, TENANT, range(0, 40))
    keyring = Keyring(LocalProvider(keys))
    versions: list[int] = []
    write = keyring.provider.write

    def counted(tenant: str, shard: int, nodes: Any, version: int) -> Any:
        versions.append(version)
        return write(tenant, shard, nodes, version)

    keyring.provider.write = counted  # type: ignore[method-assign,assignment]

    async def all_at_once() -> None:
        await asyncio.gather(*(keyring.shred(TENANT, [leaf]) for leaf in range(32)))  # started in one loop turn

    _run(all_at_once())
    assert versions == [1, 2]  # the first shred's write, then one for the 31 that queued behind it
    after = _keys(keys, TENANT, range(0, 40))
    assert after == {leaf: None if leaf < 32 else key for leaf, key in before.items()}
