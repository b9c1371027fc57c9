"""One primary and one streaming replica per test module (bench/replication.py); each module starts its server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.replication import ReplicaPair


@pytest.fixture(scope="module")
def pair() -> Iterator[ReplicaPair]:
    replicated = ReplicaPair.create(durable=False)  # fsync off: nothing here must survive a power cut
    try:
        yield replicated
    finally:
        replicated.destroy()


@pytest.fixture(autouse=True)
def replaying(pair: ReplicaPair) -> Iterator[None]:
    """Every test starts and ends with the replica replaying and caught up (a failed test may leave it paused)."""
    if not pair.promoted:
        pair.wait_caught_up()
    yield
    if not pair.promoted and pair.replica.pid() is not None:
        pair.resume_replay()
        pair.wait_caught_up()
