"""Constants and helpers shared by tests (import from here, not from conftest)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import asyncpg
import httpx

ROOT = Path(__file__).resolve().parents[1]
MODEL_CACHE = ROOT / ".lethe" / "models"
BOOTSTRAP_KEY = "test-bootstrap-key-" + "0" * 24
WEBHOOK_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PROBLEM = "application/problem+json"


def sql(database_url: str, query: str, *args: Any) -> list[asyncpg.Record]:
    """One query on its own connection: tests only look at the tables; behaviour goes through HTTP."""

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
