"""The Python client installs and works alone: `pip install ./clients/python` into a fresh virtualenv (no system
site-packages, no server, no framework), then a memory round trip with `LetheClient` and `AsyncLetheClient` against
the live server.

The venv is made once per module; `pip install` reaches PyPI (or pip's cache) for httpx, pydantic and their
dependencies. The client's source is copied to a temporary directory first, so pip's build leaves nothing in the
checkout and two runs never share a build directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import BOOTSTRAP_KEY

LiveServer = Any  # tests/conftest.py's class; fixtures are not imported from a conftest

CLIENT_SOURCE = Path(__file__).resolve().parents[2] / "clients" / "python"

SCRIPT = textwrap.dedent(
    """
    import asyncio
    import importlib.util
    import os
    import sys
    import uuid

    import lethe_client
    from lethe_client import AsyncLetheClient, Forgotten, LetheClient

    # The client came from this venv, and nothing of the server came with it.
    here = os.path.realpath(lethe_client.__file__)
    assert here.startswith(os.path.realpath(sys.prefix)), (here, sys.prefix)
    for server_only in ("app", "torch", "fastapi", "sqlalchemy"):
        assert importlib.util.find_spec(server_only) is None, f"{server_only} is importable next to the client"

    URL, KEY = os.environ["LETHE_URL"], os.environ["LETHE_KEY"]


    def sync_round_trip() -> None:
        ns = "client-pkg-" + uuid.uuid4().hex[:12]
        with LetheClient(URL, KEY, timeout=60) as lethe:
            written = lethe.put(ns, "diet", "vegan", if_none_match=True)
            assert written.created and written.version == 1, written
            record = lethe.get(ns, "diet")
            assert record.value == "vegan" and record.version == 1, record
            gone = lethe.forget(ns, "diet")
            assert gone.version == 2 and not gone.already_forgotten, gone
            try:
                lethe.get(ns, "diet")
            except Forgotten as absent:
                assert absent.version == gone.version, absent.problem
            else:
                raise AssertionError("a forgotten key was read")
            assert [e.op for e in lethe.history(ns, "diet")] == ["write", "forget"]


    async def async_round_trip() -> None:
        ns = "client-pkg-" + uuid.uuid4().hex[:12]
        async with AsyncLetheClient(URL, KEY, timeout=60) as lethe:
            written = await lethe.put(ns, "city", {"name": "Paris"}, if_none_match=True)
            assert written.created and written.version == 1, written
            record = await lethe.get(ns, "city")
            assert record.value == {"name": "Paris"} and record.version == 1, record
            gone = await lethe.forget(ns, "city")
            assert gone.version == 2 and not gone.already_forgotten, gone
            try:
                await lethe.get(ns, "city")
            except Forgotten as absent:
                assert absent.version == gone.version, absent.problem
            else:
                raise AssertionError("a forgotten key was read")
            assert (await lethe.list(ns)).keys == []


    sync_round_trip()
    asyncio.run(async_round_trip())
    print("client package ok")
    """
)


def _isolated_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that would put the server's packages on the venv's path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    return {**env, "PYTHONNOUSERSITE": "1", **extra}


@pytest.fixture(scope="module")
def client_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interpreter of a fresh venv holding `pip install ./clients/python` and nothing else."""
    root = tmp_path_factory.mktemp("client-package")
    source = root / "src"
    shutil.copytree(CLIENT_SOURCE, source, ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__"))
    venv = root / "venv"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=180, env=_isolated_env())
    made = time.monotonic()
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", str(source)],
        check=True, timeout=600, env=_isolated_env(), cwd=root,
    )
    done = time.monotonic()
    print(f"client venv: created in {made - started:.1f} s, `pip install ./clients/python` in {done - made:.1f} s")
    return python


def test_client_installs_alone_and_round_trips_memory(
    client_python: Path, live_server: LiveServer, tmp_path: Path
) -> None:
    script = tmp_path / "round_trip.py"
    script.write_text(SCRIPT, encoding="utf-8")
    ran = subprocess.run(
        [str(client_python), str(script)],
        cwd=tmp_path,  # not the checkout: `app` must not be importable from the working directory either
        env=_isolated_env(LETHE_URL=live_server.base_url, LETHE_KEY=BOOTSTRAP_KEY),
        capture_output=True, text=True, timeout=300,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "client package ok" in ran.stdout


INSPECT = textwrap.dedent(
    """
    import importlib.metadata
    import pathlib

    import lethe_client

    # The plain install's requirements; each framework is an extra ("...; extra == 'langgraph'").
    print(sorted(r for r in importlib.metadata.requires("lethe-client") or [] if "extra ==" not in r))
    print((pathlib.Path(lethe_client.__file__).parent / "py.typed").is_file())
    """
)


def test_the_installed_distribution_depends_on_httpx_and_pydantic_only_and_is_typed(
    client_python: Path, tmp_path: Path
) -> None:
    ran = subprocess.run(
        [str(client_python), "-c", INSPECT],
        cwd=tmp_path, env=_isolated_env(), capture_output=True, text=True, timeout=60, check=True,
    )
    assert ran.stdout.split("\n")[:2] == ["['httpx>=0.27', 'pydantic>=2.7']", "True"], ran.stdout
