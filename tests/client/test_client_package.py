"""The Python client installs and works alone: `pip install ./clients/python` into a fresh virtualenv (no system
site-packages, no server, no framework), then a memory round trip with `LetheClient` and `AsyncLetheClient` against
the live server, and a data subject's calls (link, export, erasure plan and confirmation, legal holds) with both.

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


SUBJECTS_SCRIPT = textwrap.dedent(
    """
    import asyncio
    import io
    import json
    import os
    import uuid

    from lethe_client import AsyncLetheClient, LetheClient, NotFound
    from lethe_client.errors import LegalHold

    URL, KEY = os.environ["LETHE_URL"], os.environ["LETHE_KEY"]


    def sync_subject() -> None:
        # ':' and '@' are allowed in a subject id and must survive as one path segment.
        subject, ns = "client:" + uuid.uuid4().hex[:8] + "@example.com", "client-subj-" + uuid.uuid4().hex[:8]
        with LetheClient(URL, KEY, timeout=60) as lethe:
            assert lethe.put_subject(subject, [ns])["memory_namespaces"] == [ns]
            session = lethe.create_session(subject_id=subject)["id"]
            lethe.post_turn(session, [{"type": "user", "content": "My code is QZ-4417."}], generate=False)
            lethe.put(ns, "diet", "vegan", if_none_match=True)
            assert lethe.get_subject(subject)["session_ids"] == [session]

            exported = lethe.export_subject(subject)
            assert [s["id"] for s in exported["sessions"]] == [session], exported
            assert "QZ-4417" in json.dumps(exported) and exported["memory"][0]["value"] == "vegan"
            streamed = io.BytesIO()
            assert lethe.export_subject_to(subject, streamed) == len(streamed.getvalue())
            assert json.loads(streamed.getvalue())["sessions"] == exported["sessions"]

            plan = lethe.subject_erase_plan(subject)
            assert (plan["dry_run"], plan["sessions"], plan["memory_keys"]) == (True, [session], 1), plan
            hold = lethe.place_hold(subject_id=subject, reason="litigation")
            try:
                lethe.subject_erase_confirm(subject, reason="the person asked")
            except LegalHold as held:
                assert held.hold_id == hold["id"], held.problem
            else:
                raise AssertionError("an erasure under a legal hold ran")
            assert lethe.release_hold(hold["id"])["released_at"] is not None

            done = lethe.subject_erase_confirm(subject, reason="the person asked")
            assert done["status"] == "succeeded" and done["subject"]["sessions"] == [session], done
            try:
                lethe.get_session(session)
            except NotFound:
                pass
            else:
                raise AssertionError("an erased session was read")
            try:
                lethe.export_subject_to("client-nobody-" + uuid.uuid4().hex[:8], streamed)
            except NotFound:
                pass
            else:
                raise AssertionError("an unknown subject exported")


    async def async_subject() -> None:
        subject = "client-" + uuid.uuid4().hex[:8]
        async with AsyncLetheClient(URL, KEY, timeout=60) as lethe:
            session = (await lethe.create_session(subject_id=subject))["id"]
            streamed = io.BytesIO()
            assert await lethe.export_subject_to(subject, streamed) > 0
            assert json.loads(streamed.getvalue())["sessions"][0]["id"] == session
            assert (await lethe.export_subject(subject))["subject"]["id"] == subject
            plan = await lethe.subject_erase_plan(subject, also_text=["said-nowhere-" + uuid.uuid4().hex[:8]])
            assert (plan["sessions"], plan["also"]) == ([session], []), plan
            hold = await lethe.place_hold(session_id=session, reason="litigation")
            assert (await lethe.get_hold(hold["id"]))["session_id"] == session
            done = await lethe.subject_erase_confirm(subject)  # the held session is skipped, and deferred on the hold
            assert done["subject"]["held"] == [{"hold_id": hold["id"], "session_id": session}], done
            assert (await lethe.get_subject(subject))["session_ids"] == [session]
            released = await lethe.release_hold(hold["id"])
            assert len(released["erasures"]) == 1, released
            rerun = await lethe.wait_forget(released["erasures"][0], timeout_s=300)  # queued by the release
            assert rerun["subject"]["sessions"] == [session], rerun
            try:
                await lethe.get_session(session)
            except NotFound:
                pass
            else:
                raise AssertionError("the deferred erasure did not run on release")


    sync_subject()
    asyncio.run(async_subject())
    print("client subjects ok")
    """
)


def test_client_calls_a_data_subjects_routes(client_python: Path, live_server: LiveServer, tmp_path: Path) -> None:
    script = tmp_path / "subjects.py"
    script.write_text(SUBJECTS_SCRIPT, encoding="utf-8")
    ran = subprocess.run(
        [str(client_python), str(script)],
        cwd=tmp_path,
        env=_isolated_env(LETHE_URL=live_server.base_url, LETHE_KEY=BOOTSTRAP_KEY),
        capture_output=True, text=True, timeout=300,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "client subjects ok" in ran.stdout


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
