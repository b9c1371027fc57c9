"""`lethe serve` as a separate process on the test database: a second API process, or one to kill like a crash."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support import BOOTSTRAP_KEY, MODEL_CACHE, ROOT, free_port

LETHE = [str(ROOT / ".venv/bin/lethe")] if (ROOT / ".venv/bin/lethe").exists() else [sys.executable, "-m", "app"]


class ServeProcess:
    """`lethe serve` in its own process on the test database, so it can be killed like a crashed server."""

    def __init__(self, database_url: str, data_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "LETHE_DATABASE_URL": database_url,
            "LETHE_DATA_DIR": str(data_dir),
            "LETHE_MODEL_CACHE_DIR": str(MODEL_CACHE),
            "LETHE_PORT": str(self.port),
            "LETHE_BOOTSTRAP_API_KEY": BOOTSTRAP_KEY,
            "LETHE_FORGET_LEASE_S": "2",
            "LETHE_FORGET_POLL_S": "0.2",
            "LETHE_LOG_LEVEL": "WARNING",
        }
        self.proc = subprocess.Popen(
            [*LETHE, "serve"], cwd=ROOT, env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "the server exited"
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError("the server did not become ready")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)
