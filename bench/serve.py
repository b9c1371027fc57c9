"""A real `lethe serve` in a child process: the one way the tests, the benches and the eval harness start one.

It lives beside the benches, not in the installed `app` package: only the source checkout starts servers this way,
and the tests import it from there (pytest puts the checkout on `sys.path`). The server is started as
`python -m app serve` with this interpreter, so it runs the checkout's code in any virtual environment.

    with serving(ready_s=600, LETHE_ENGINE="vllm") as server:   # a temporary data directory, removed after
        httpx.get(server.url + "/readyz")

`LetheServer` is the process itself, for callers that stop or kill it at a chosen moment (a crash test).
`tree=` serves another checkout's code (a `git worktree` of an older commit) with this interpreter: it is started
in that tree with it first on PYTHONPATH, so `python -m app` imports its `app` (bench/memory_sealing.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
MODEL_CACHE = ROOT / ".lethe" / "models"
LETHE = [sys.executable, "-m", "app"]
POLL_S = 0.25  # a separate process coming up: nothing to wait on but its /readyz


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_env(data_dir: Path, **overrides: str) -> dict[str, str]:
    """The environment of a `lethe` command on `data_dir`: the converted model of the checkout, offline, quiet.

    A LETHE_DATABASE_URL of the caller's own shell is dropped: without one in `overrides` the command uses the
    embedded PostgreSQL under `data_dir`, never a database it happened to inherit."""
    env = {key: value for key, value in os.environ.items() if key != "LETHE_DATABASE_URL"}
    env.update({
        "LETHE_DATA_DIR": str(data_dir),
        "LETHE_HOST": "127.0.0.1",
        "LETHE_MODEL_CACHE_DIR": str(MODEL_CACHE),
        "LETHE_LOG_LEVEL": "WARNING",  # an access line per request would cost a loaded server more than the work
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
    })
    env.update(overrides)
    return env


class LetheServer:
    """`lethe serve` on a free loopback port, in a session of its own, its output in `log`.

    `stop()` sends SIGTERM to the server process alone, as `kill <pid>` does: the embedded PostgreSQL it started
    is signalled by no one else, so the server must stop it itself (tests/foundation/test_serve_process.py)."""

    def __init__(self, data_dir: Path, log: Path | None = None, *, tree: Path = ROOT, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = data_dir
        self.tree = tree
        self.env = serve_env(data_dir, LETHE_PORT=str(self.port), **env)
        if tree != ROOT:  # `python -m` puts the working directory first, PYTHONPATH carries it to the workers
            self.env["PYTHONPATH"] = str(tree)
        self.log = log or data_dir / f"lethe-serve-{self.port}.log"  # several servers may share one data directory
        self._out = self.log.open("w")
        self.started = time.monotonic()
        self.startup_s = 0.0  # seconds until /readyz first answered 200, once wait_ready() saw it
        self.proc = subprocess.Popen(
            [*LETHE, "serve"], cwd=self.tree, env=self.env, stdout=self._out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def wait_ready(self, timeout_s: float = 300) -> float:
        """Until /readyz answers 200; the seconds since the start. An exit or a timeout raises, with the log's end."""
        deadline = self.started + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lethe serve exited with {self.proc.returncode}; its log ends: {self.log_tail()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    self.startup_s = time.monotonic() - self.started
                    return self.startup_s
            if time.monotonic() > deadline:
                raise RuntimeError(f"lethe serve not ready after {timeout_s:.0f} s; its log ends: {self.log_tail()}")
            time.sleep(POLL_S)

    def cli(self, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
        """`lethe <args>` on this server's database and data directory (`lethe tenant create acme`)."""
        return subprocess.run(
            [*LETHE, *args], cwd=self.tree, env=self.env, capture_output=True, text=True, timeout=timeout_s, check=False
        )

    def stop(self, timeout_s: float = 60) -> int:
        """SIGTERM to the server; its exit status. One still alive after `timeout_s` is killed, with its session,
        and raises: a server that does not stop on SIGTERM is a bug."""
        try:
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()
                    raise RuntimeError(f"lethe serve did not stop within {timeout_s:.0f} s of SIGTERM") from None
        finally:
            self._out.close()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL, like a crash: no exit handler runs."""
        self.proc.kill()
        self.proc.wait()
        self._out.close()


def stop_postgres(pgdata: Path) -> None:
    """The embedded PostgreSQL stops with the last process using it; should one outlive its server, stop it here."""
    pid_file = pgdata / "postmaster.pid"
    if not pid_file.exists():
        return
    with contextlib.suppress(ValueError, IndexError, ProcessLookupError, PermissionError):
        pid = int(pid_file.read_text().splitlines()[0])
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            os.kill(pid, 0)  # raises ProcessLookupError once it is gone
            time.sleep(0.1)


@contextlib.contextmanager
def serving(
    data_dir: Path | None = None, ready_s: float = 300, *, tree: Path = ROOT, **env: str
) -> Iterator[LetheServer]:
    """A ready `lethe serve` for the block, stopped after it. Without `data_dir`, on a temporary one (its embedded
    PostgreSQL inside), removed with that database afterwards. `tree`: the checkout whose code serves."""
    own = data_dir is None
    directory = Path(tempfile.mkdtemp(prefix="lethe-serve-")) if data_dir is None else data_dir
    server = LetheServer(directory, None, tree=tree, **env)
    try:
        server.wait_ready(ready_s)
        yield server
    finally:
        try:
            server.stop()
        finally:
            if own:
                stop_postgres(directory / "pg")
                shutil.rmtree(directory, ignore_errors=True)
