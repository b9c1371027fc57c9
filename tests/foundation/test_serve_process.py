"""`lethe serve` and `lethe tenant` as real processes: bootstrap, CLI-made tenants, two processes on one database,
and no secret in any log line."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import MODEL_CACHE, free_port

ROOT = Path(__file__).resolve().parents[2]
LETHE = [sys.executable, "-m", "app"] if not (ROOT / ".venv/bin/lethe").exists() else [str(ROOT / ".venv/bin/lethe")]
KEY = "proc-key-" + "7" * 30
SECRET = "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQtMTIzNDU2"


def _env(data_dir: Path, port: int | None = None) -> dict[str, str]:
    env = dict(os.environ)
    if port is not None:
        env["LETHE_PORT"] = str(port)
    env.update({
        "LETHE_DATA_DIR": str(data_dir), "LETHE_HOST": "127.0.0.1",
        "LETHE_BOOTSTRAP_API_KEY": KEY, "LETHE_BOOTSTRAP_WEBHOOK_SECRET": SECRET,
        "LETHE_MODEL_CACHE_DIR": str(MODEL_CACHE), "LETHE_LOG_LEVEL": "DEBUG",
    })
    env.pop("LETHE_DATABASE_URL", None)
    return env


class Proc:
    def __init__(self, data_dir: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self._out = log.open("w")
        self.proc = subprocess.Popen(
            [*LETHE, "serve"], cwd=ROOT, env=_env(data_dir, self.port), stdout=self._out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 300) -> float:
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return time.monotonic() - start
            time.sleep(0.25)  # polling a separate process for readiness
        raise AssertionError("not ready: " + self.log.read_text()[-3000:])

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._out.close()


@contextlib.contextmanager
def serving(data_dir: Path, log: Path) -> Iterator[Proc]:
    proc = Proc(data_dir, log)
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LETHE, *args], cwd=ROOT, env=_env(data_dir), capture_output=True, text=True, timeout=300, check=False
    )


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serve")


def test_bootstrap_key_works_at_once_and_secrets_stay_out_of_logs(data_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with serving(data_dir, log) as proc:
        headers = {"Authorization": f"Bearer {KEY}"}
        assert httpx.post(proc.url + "/v1/sessions", json={}).status_code == 401
        assert httpx.get(proc.url + "/v1/forget/fgt_x", headers=headers).status_code != 401
        assert "# HELP" in httpx.get(proc.url + "/metrics").text
    text = log.read_text()
    assert "request_id" in text  # structured access lines were written
    assert KEY not in text and SECRET not in text and SECRET.removeprefix("whsec_") not in text


def test_restart_keeps_one_default_tenant_and_the_key(data_dir: Path, tmp_path: Path) -> None:
    with serving(data_dir, tmp_path / "again.log") as proc:
        assert httpx.get(proc.url + "/v1/forget/fgt_x", headers={"Authorization": f"Bearer {KEY}"}).status_code != 401
    listed = _cli(data_dir, "tenant", "create", "default")
    assert listed.returncode == 1 and "already exists" in listed.stderr


def test_tenant_cli_creates_a_working_hashed_key(data_dir: Path, tmp_path: Path) -> None:
    created = _cli(data_dir, "tenant", "create", "acme")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert key.startswith("lethe_") and len(key) > 40
    rotated = _cli(data_dir, "tenant", "webhook-secret", "acme")
    assert rotated.returncode == 0 and rotated.stdout.strip().startswith("whsec_")
    assert _cli(data_dir, "tenant", "webhook-secret", "nobody").returncode == 1
    assert _cli(data_dir, "tenant", "webhook-secret", "acme", "--secret", "not-a-secret").returncode == 1
    with serving(data_dir, tmp_path / "acme.log") as proc:
        assert httpx.get(proc.url + "/v1/forget/fgt_x", headers={"Authorization": f"Bearer {key}"}).status_code != 401
    dump = subprocess.run(
        [sys.executable, "-c", (
            "import asyncio, asyncpg, sys\n"
            "from app.db.embedded import start_embedded_postgres\n"
            f"url = start_embedded_postgres(__import__('pathlib').Path({str(data_dir)!r}))\n"
            "async def main():\n"
            "    c = await asyncpg.connect(url)\n"
            "    rows = await c.fetch('SELECT row_to_json(k)::text AS r FROM api_keys k')\n"
            "    print('\\n'.join(r['r'] for r in rows))\n"
            "asyncio.run(main())\n"
        )], cwd=ROOT, env=_env(data_dir), capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    assert dump.count("key_sha256") >= 2
    assert key not in dump and KEY not in dump


def test_two_processes_share_one_database(data_dir: Path, tmp_path: Path) -> None:
    first, second = Proc(data_dir, tmp_path / "one.log"), Proc(data_dir, tmp_path / "two.log")
    try:
        first.wait_ready()
        second.wait_ready()
        for proc in (first, second):
            response = httpx.get(proc.url + "/v1/forget/fgt_x", headers={"Authorization": f"Bearer {KEY}"})
            assert response.status_code != 401
    finally:
        first.stop()
        second.stop()
