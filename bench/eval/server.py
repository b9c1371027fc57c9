"""Where the harness finds Lethe: a `lethe serve` of its own (embedded PostgreSQL in a temporary directory, the
converted model from .lethe/models; bench.serve, the way the tests and the benches start one), or an already
running deployment given by `--url` and `--api-key` (any engine: the harness only speaks HTTP)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import httpx

from bench.forget_bench import API_KEY
from bench.serve import serving


@dataclass(frozen=True)
class Service:
    url: str
    api_key: str
    engine: str  # what we started, or "external"
    started_s: float  # seconds until /readyz answered 200 (0 for an external service)


@contextlib.contextmanager
def service(url: str | None, api_key: str | None, engine: str, ready_s: float = 600.0) -> Iterator[Service]:
    if url:
        if not api_key:
            raise ValueError("--url needs --api-key")
        r = httpx.get(url.rstrip("/") + "/readyz", timeout=10)
        if r.status_code != 200:
            raise RuntimeError(f"{url}/readyz answered {r.status_code}: {r.text[:300]}")
        yield Service(url.rstrip("/"), api_key, "external", 0.0)
        return
    with serving(ready_s=ready_s, LETHE_ENGINE=engine, LETHE_BOOTSTRAP_API_KEY=API_KEY) as server:
        yield Service(server.url, API_KEY, engine, server.startup_s)
