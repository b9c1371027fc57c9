"""Helpers of the memory tests: problem+json assertions, conditional writes, read-only SQL on the test database."""

from __future__ import annotations

from typing import Any

import httpx


def create(client: httpx.Client, ns: str, key: str, value: Any, source: str = "user") -> int:
    r = client.put(f"/v1/memory/{ns}/{key}", json={"value": value, "source": source}, headers={"If-None-Match": "*"})
    assert r.status_code == 201, r.text
    version: int = r.json()["version"]
    return version


def write(client: httpx.Client, ns: str, key: str, value: Any, base: int, source: str = "user") -> httpx.Response:
    body = {"value": value, "source": source}
    return client.put(f"/v1/memory/{ns}/{key}", json=body, headers={"If-Match": f'"{base}"'})
