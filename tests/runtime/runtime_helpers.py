"""Helpers of the runtime tests: sessions and turns over HTTP, problem+json assertions, read-only SQL."""

from __future__ import annotations

import itertools
from typing import Any

import httpx

SYSTEM = "You are a helpful assistant. Answer briefly."






def create_session(client: httpx.Client, **config: Any) -> str:
    config.setdefault("system_prompt", SYSTEM)
    config.setdefault("sampling", {"temperature": 0, "max_tokens": 8, "seed": 1})
    r = client.post("/v1/sessions", json=config)
    assert r.status_code == 201, r.text
    session_id: str = r.json()["id"]
    return session_id


def user(text: str) -> dict[str, str]:
    return {"type": "user", "content": text}


def turn(client: httpx.Client, session_id: str, *inputs: dict[str, Any], generate: bool = True) -> dict[str, Any]:
    r = client.post(f"/v1/sessions/{session_id}/turns", json={"inputs": list(inputs), "generate": generate})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def artifacts(client: httpx.Client, session_id: str) -> list[dict[str, Any]]:
    r = client.get(f"/v1/sessions/{session_id}/artifacts")
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["artifacts"]
    return items


def assert_tiles(items: list[dict[str, Any]]) -> None:
    """Live artifacts' spans tile the log from 0 with no gap or overlap."""
    spans = [a["token_span"] for a in items]
    assert spans and spans[0][0] == 0, spans
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in itertools.pairwise(spans)), spans


def session(client: httpx.Client, session_id: str) -> dict[str, Any]:
    r = client.get(f"/v1/sessions/{session_id}")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body
