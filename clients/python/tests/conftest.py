"""The framework integrations' tests, run in the client's own virtualenv (clients/python/.venv, made by `make test`)
against a live Lethe: the server's suite starts one and runs this directory (tests/client/test_frameworks.py); by hand,
point them at any server with `LETHE_URL` and `LETHE_KEY` (an admin key of a tenant made for the run).

Nothing here imports the server: these tests see Lethe only over HTTP, as a user's framework does.
"""

from __future__ import annotations

import os
import uuid

import pytest


def _required(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise pytest.UsageError(f"{name} is not set: these tests need a live Lethe (see this conftest's docstring)")
    return value


@pytest.fixture(scope="session")
def lethe_url() -> str:
    return _required("LETHE_URL")


@pytest.fixture(scope="session")
def lethe_key() -> str:
    return _required("LETHE_KEY")


@pytest.fixture
def unique() -> str:
    """A name no other test (or earlier run against the same server) has used."""
    return uuid.uuid4().hex[:12]
