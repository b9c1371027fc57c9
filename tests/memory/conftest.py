"""Fixtures for the memory tests: a fresh namespace per test and the Python client (the second
tenant is tests/conftest.py's `other_tenant`).

Direct SQL (tests/support.py) is only ever used to *look* at what the tables hold, or to hold a row
lock so a request is provably in flight; every behaviour under test goes through HTTP against the live server.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from lethe_client import LetheClient

from tests.support import BOOTSTRAP_KEY

LiveServer = Any  # tests/conftest.py's class; fixtures are not imported from a conftest


@pytest.fixture
def ns() -> str:
    """A namespace of this test's own, so tests sharing the run's database never see each other's keys."""
    return "t-" + uuid.uuid4().hex[:12]


@pytest.fixture
def api_key() -> str:
    """The bootstrap key the shared `client` fixture authenticates with."""
    return BOOTSTRAP_KEY


@pytest.fixture
def lethe(live_server: LiveServer, api_key: str) -> Iterator[LetheClient]:
    with LetheClient(live_server.base_url, api_key, timeout=60) as client:
        yield client
