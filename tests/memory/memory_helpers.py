"""Helpers of the memory tests: problem+json assertions, conditional writes, read-only SQL on the test database."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import httpx

PROBLEM = "application/problem+json"


def sql(database_url: str, query: str, *args: Any) -> list[asyncpg.Record]:
    """Run one query on its own connection (tests only look; behaviour goes through HTTP)."""

    async def run() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(database_url)
        try:
            return list(await conn.fetch(query, *args))
        finally:
            await conn.close()

    return asyncio.run(run())


def problem(response: httpx.Response, status: int) -> dict[str, Any]:
    """Assert a problem+json answer with `status`; return its body."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith(PROBLEM), response.headers
    body: dict[str, Any] = response.json()
    assert body["status"] == status and body["type"] and body["title"]
    return body


def create(client: httpx.Client, ns: str, key: str, value: Any, source: str = "user") -> int:
    r = client.put(f"/v1/memory/{ns}/{key}", json={"value": value, "source": source}, headers={"If-None-Match": "*"})
    assert r.status_code == 201, r.text
    version: int = r.json()["version"]
    return version


def write(client: httpx.Client, ns: str, key: str, value: Any, base: int, source: str = "user") -> httpx.Response:
    body = {"value": value, "source": source}
    return client.put(f"/v1/memory/{ns}/{key}", json=body, headers={"If-Match": f'"{base}"'})
