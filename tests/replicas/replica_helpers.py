"""Helpers of the read-replica tests: a real primary and a real streaming replica (bench/replication.py) under a real
`lethe serve`, and what its /metrics says about where each read went.

The server runs one process, and during a test only the test's own requests read, so the change of
`lethe_reads_total` across a request says exactly who served it (the replicas' lag probe is not counted there).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator

import httpx

from bench.replication import ReplicaPair, served_reads
from bench.serve import LetheServer, serving
from tests.support import BOOTSTRAP_KEY, POLL_S

HEADER = "Lethe-Consistency"
_SAMPLE = re.compile(r'^(lethe_[a-z_]+)\{([^}]*)\} ([0-9.e+-]+)$')
_LABEL = re.compile(r'([a-z_]+)="([^"]*)"')


def metric(base_url: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of one metric, by their sorted labels."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    samples: dict[tuple[tuple[str, str], ...], float] = {}
    for line in text.splitlines():
        found = _SAMPLE.match(line)
        if found and found.group(1) == name:
            samples[tuple(sorted(_LABEL.findall(found.group(2))))] = float(found.group(3))
    return samples


def reads(base_url: str) -> Counter[tuple[str, str]]:
    """`lethe_reads_total` as {(served_by, reason): count}."""
    return served_reads(base_url)


def served(base_url: str, before: Counter[tuple[str, str]]) -> Counter[tuple[str, str]]:
    """Reads served since `before`, by (served_by, reason)."""
    now = reads(base_url)
    now.subtract(before)
    return +now  # drops zeros


def wait_metric(base_url: str, name: str, check: Callable[[float], bool], limit_s: float = 120) -> float:
    """Until the sample of `name` (a replica's gauge: one replica, one sample) satisfies `check`; its value. A
    barrier on the server's own probe, which runs every LETHE_REPLICA_PROBE_S."""
    deadline = time.monotonic() + limit_s
    while True:
        values = list(metric(base_url, name).values())
        if values and check(values[0]):
            return values[0]
        assert time.monotonic() < deadline, f"{name} never satisfied the check: {values}"
        time.sleep(POLL_S)


@contextlib.contextmanager
def lethe_on(pair: ReplicaPair, *, primary: str | None = None, replicas: str | None = None,
             **env: str) -> Iterator[LetheServer]:
    """A ready `lethe serve` on the pair: its primary, its replica as the one read replica (by default)."""
    settings = {
        "LETHE_DATABASE_URL": primary or pair.primary.url,
        "LETHE_DATABASE_REPLICA_URLS": pair.replica.url if replicas is None else replicas,
        "LETHE_BOOTSTRAP_API_KEY": BOOTSTRAP_KEY,
        "LETHE_REPLICA_PROBE_S": "0.2",
        **env,
    }
    with serving(ready_s=600, **settings) as server:
        yield server


def client_of(server: LetheServer) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {BOOTSTRAP_KEY}"}, timeout=120)
