"""Fixtures of the runtime tests: the live server's engine and cache handles for the replay-level tests.

Every behaviour goes through HTTP against the real app (real SmolLM2, real PostgreSQL). Direct SQL only looks at
what the tables hold, or holds a row lock so a turn is provably blocked. The replay test drives the runtime's
transition functions on the live server's own engine, which is what a forget job will do.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.engine.protocol import KVEngine
from app.engine.session_caches import LocalSessionCaches

LiveServer = Any  # tests/conftest.py's class; fixtures are not imported from a conftest


@pytest.fixture
def server_handles(live_server: LiveServer) -> LocalSessionCaches:
    handles: LocalSessionCaches = live_server.app.state.container.handles
    return handles


@pytest.fixture
def server_engine(live_server: LiveServer) -> KVEngine:
    engine: KVEngine = live_server.app.state.container.engine.engine
    return engine
