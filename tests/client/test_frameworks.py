"""The framework integrations (clients/python/tests) run in the client's own virtualenv, never in the server's: the
frameworks pin what the server must not (CrewAI: pydantic<2.13, chromadb, lancedb). This module starts nothing of its
own: it points that venv's pytest at the suite's live server, one client test file per test here, so a failure names
the integration and shows its output.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support import BOOTSTRAP_KEY

LiveServer = Any  # tests/conftest.py's class; fixtures are not imported from a conftest

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "python"
CLIENT_PYTHON = CLIENT / ".venv" / "bin" / "python"
CLIENT_TESTS = sorted(path.name for path in (CLIENT / "tests").glob("test_*.py"))


def test_every_integration_has_client_tests() -> None:
    assert CLIENT_PYTHON.exists(), "the client venv is missing: `make test` makes clients/python/.venv"
    assert CLIENT_TESTS, "clients/python/tests holds no tests"


@pytest.mark.parametrize("test_file", CLIENT_TESTS)
def test_client_suite(live_server: LiveServer, test_file: str, tmp_path: Path) -> None:
    env = {
        key: value for key, value in os.environ.items() if not key.startswith(("VIRTUAL_ENV", "PYTHON", "LETHE_"))
    }
    env |= {"LETHE_URL": live_server.base_url, "LETHE_KEY": BOOTSTRAP_KEY}
    done = subprocess.run(
        # A basetemp of its own: without one, pytest takes group and other access away from /tmp/pytest-of-<user>
        # ("keep it private"), and the embedded PostgreSQL servers of this run, which pgserver runs as another user
        # with their data directories under it, can no longer reach their files (a PANIC at the next checkpoint).
        [str(CLIENT_PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'client'}",
         f"tests/{test_file}"],
        cwd=CLIENT, env=env, capture_output=True, text=True, timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-5000:]
