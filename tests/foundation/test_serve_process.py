"""`lethe serve` and `lethe tenant` as real processes: bootstrap, CLI-made tenants, two processes on one database,
no secret in any log line, and nothing left running once they stop (SIGTERM mid-generation, or a crash).

Processes are stopped the way an operator or a supervisor does it, `kill <pid>` (SIGTERM to that process only), so
the embedded PostgreSQL they started is not signalled by anyone else: they must stop it themselves."""

from __future__ import annotations

import contextlib
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.serve import LETHE, ROOT, LetheServer, serve_env

KEY = "proc-key-" + "7" * 30
SECRET = "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQtMTIzNDU2"
ENV = {"LETHE_BOOTSTRAP_API_KEY": KEY, "LETHE_BOOTSTRAP_WEBHOOK_SECRET": SECRET, "LETHE_LOG_LEVEL": "DEBUG"}


def start(data_dir: Path, log: Path, **env: str) -> LetheServer:
    return LetheServer(data_dir, log, **ENV, **env)


@contextlib.contextmanager
def serving(data_dir: Path, log: Path) -> Iterator[LetheServer]:
    server = start(data_dir, log)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def _cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LETHE, *args], cwd=ROOT, env=serve_env(data_dir, **ENV), capture_output=True, text=True, timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serve")


def test_bootstrap_key_works_at_once_and_secrets_stay_out_of_logs(data_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with serving(data_dir, log) as proc:
        headers = {"Authorization": f"Bearer {KEY}"}
        assert httpx.post(proc.url + "/v1/sessions", json={}).status_code == 401
        assert httpx.get(proc.url + "/v1/forget/fgt_x", headers=headers).status_code == 404  # the route's own answer
        assert "# HELP" in httpx.get(proc.url + "/metrics").text
    text = log.read_text()
    assert "request_id" in text  # structured access lines were written
    assert KEY not in text and SECRET not in text and SECRET.removeprefix("whsec_") not in text


def test_an_idle_connection_outlives_the_clients_own_pool_expiry(data_dir: Path, tmp_path: Path) -> None:
    """httpx drops a pooled connection once it has been idle for its `keepalive_expiry` (5 s); until that instant it
    may send a request on it, and a server closing it at the same moment resets that request (a ReadError under
    load). So the server must keep an idle connection open past the client's own expiry.

    The test waits for one of two events, whichever comes first: the server closing (or writing to) the idle
    connection, or the instant httpx's own pool would expire it (`httpx.Limits().keepalive_expiry` after the answer
    was read, not a number of ours). A server that closes first fails it; one still holding the connection then must
    serve a request sent on it, as a client would send one right before its expiry. A slow machine can only delay a
    server's close, never bring it forward, so it cannot make this test fail."""
    expiry_s = httpx.Limits().keepalive_expiry
    assert expiry_s is not None and expiry_s > 0
    with serving(data_dir, tmp_path / "idle.log") as proc, socket.create_connection(("127.0.0.1", proc.port)) as conn:
        request = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{proc.port}\r\n\r\n".encode()
        conn.sendall(request)
        assert _read_answer(conn).startswith(b"HTTP/1.1 200")
        expires_at = time.monotonic() + expiry_s  # from here on the connection is idle, as in the client's pool
        while (left := expires_at - time.monotonic()) > 0:
            readable, _, _ = select.select([conn], [], [], left)
            assert not readable, (
                f"the server closed (or wrote to) the idle connection {expires_at - time.monotonic():.2f} s before "
                f"the client's pool would have expired it: {conn.recv(65536)!r}"
            )
        conn.sendall(request)  # what the client sends on its pooled connection at that instant
        assert _read_answer(conn).startswith(b"HTTP/1.1 200")


def _read_answer(conn: socket.socket) -> bytes:
    """One whole HTTP/1.1 answer (head and Content-Length body) read from `conn`; an empty read fails: closed."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = conn.recv(65536)
        assert chunk, f"the server closed the connection mid-answer: {answer!r}"
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    length = int(next(line for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:"))[15:])
    while len(body) < length:  # the body may come in a segment of its own
        chunk = conn.recv(65536)
        assert chunk, f"the server closed the connection mid-body: {answer!r}"
        body += chunk
    assert len(body) == length, "more than one answer: nothing else was asked"
    return head + b"\r\n\r\n" + body


def test_restart_keeps_one_default_tenant_and_the_key(data_dir: Path, tmp_path: Path) -> None:
    with serving(data_dir, tmp_path / "again.log") as proc:
        assert httpx.get(proc.url + "/v1/forget/fgt_x", headers={"Authorization": f"Bearer {KEY}"}).status_code == 404
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
        assert httpx.get(proc.url + "/v1/forget/fgt_x", headers={"Authorization": f"Bearer {key}"}).status_code == 404
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
        )], cwd=ROOT, env=serve_env(data_dir, **ENV), capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    assert dump.count("key_sha256") >= 2
    assert key not in dump and KEY not in dump


def test_two_processes_share_one_database(data_dir: Path, tmp_path: Path) -> None:
    """Both processes serve the one database under `data_dir`: a session created through either is read through the
    other. (Two databases bootstrapped with the same key would both authenticate it, and answer 404 here.)"""
    first, second = start(data_dir, tmp_path / "one.log"), start(data_dir, tmp_path / "two.log")
    headers = {"Authorization": f"Bearer {KEY}"}
    try:
        first.wait_ready()
        second.wait_ready()
        for writer, reader in ((first, second), (second, first)):
            prompt = f"Written through the process on port {writer.port}, read through {reader.port}."
            created = httpx.post(writer.url + "/v1/sessions", headers=headers, json={"system_prompt": prompt})
            assert created.status_code == 201, created.text
            read = httpx.get(f"{reader.url}/v1/sessions/{created.json()['id']}", headers=headers)
            assert read.status_code == 200, read.text  # the reader never saw it: only the shared database has it
            assert read.json() == created.json()
    finally:
        first.stop()
        second.stop()


def _postgres_running(data_dir: Path) -> bool:
    """PostgreSQL removes postmaster.pid when it shuts down; a server that is up (or died unclean) leaves it."""
    return (data_dir / "pg" / "postmaster.pid").exists()


def test_sigterm_mid_generation_stops_at_once_and_leaves_nothing_running(data_dir: Path, tmp_path: Path) -> None:
    proc = start(data_dir, tmp_path / "term.log", LETHE_SHUTDOWN_GRACE_S="1")
    try:
        proc.wait_ready()
        headers = {"Authorization": f"Bearer {KEY}"}
        created = httpx.post(proc.url + "/v1/sessions", headers=headers,
                             json={"sampling": {"max_tokens": 4096}})
        session_id = created.json()["id"]
        turn = {"inputs": [{"type": "user", "content": "Count from 1 to 10000, separated by commas."}],
                "stream": True}
        with httpx.stream("POST", f"{proc.url}/v1/sessions/{session_id}/turns", json=turn, headers=headers,
                          timeout=120) as stream:
            lines = stream.iter_lines()
            assert next(line for line in lines if line.startswith("event: ")) == "event: delta"
            assert _postgres_running(data_dir)
            # A reply of minutes is being sampled now. Before, the engine's close waited for all of it.
            proc.proc.send_signal(signal.SIGTERM)
            started = time.monotonic()
            rest: list[str] = []
            with contextlib.suppress(httpx.TransportError):  # the server may cut the stream mid-chunk
                rest.extend(lines)
        assert proc.stop() == 128 + signal.SIGTERM
        stopped_in = time.monotonic() - started
    finally:
        if proc.proc.poll() is None:
            proc.kill()
    assert "event: turn" not in rest  # the reply was cut, not finished
    assert not _postgres_running(data_dir), proc.log.read_text()[-3000:]
    print(f"stopped {stopped_in:.1f} s after SIGTERM, mid-generation")


def test_a_crashed_server_does_not_keep_postgres_up_forever(data_dir: Path, tmp_path: Path) -> None:
    crashed = start(data_dir, tmp_path / "crashed.log")
    crashed.wait_ready()
    crashed.kill()  # SIGKILL: no exit handler ran, its pid stays in pgserver's list of holders
    assert _postgres_running(data_dir)
    with serving(data_dir, tmp_path / "next.log") as proc:  # a crash blocks no start
        assert httpx.get(proc.url + "/readyz").status_code == 200
    assert not _postgres_running(data_dir), "the last live holder did not stop the server"
