"""The operator's view of memory (GET /v1/memory, include_forgotten): namespaces with counts, keys with tombstones by
name, never a value; tenant scoped; keyset pages."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from tests.support import problem


def put(client: httpx.Client, ns: str, key: str, value: Any) -> None:
    r = client.put(f"/v1/memory/{ns}/{key}", json={"value": value}, headers={"If-None-Match": "*"})
    assert r.status_code == 201, r.text


def all_namespaces(client: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    cursor = None
    while True:
        r = client.get("/v1/memory", params={**params, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        found.extend(r.json()["namespaces"])
        cursor = r.json()["next_cursor"]
        if cursor is None:
            return found


def test_namespaces_count_live_and_forgotten_keys(client: httpx.Client, other_tenant: httpx.Client) -> None:
    stem = "cat-" + uuid.uuid4().hex[:10]
    a, b = f"{stem}-a", f"{stem}-b"
    for key in ("diet", "city", "pet"):
        put(client, a, key, f"secret {key} value")
    put(client, b, "x", 1)
    assert client.delete(f"/v1/memory/{a}/city").status_code == 200
    mine = {n["namespace"]: n for n in all_namespaces(client, limit=1) if n["namespace"].startswith(stem)}
    assert list(mine) == [a, b]  # name order across pages of one
    assert (mine[a]["live_keys"], mine[a]["forgotten_keys"]) == (2, 1)
    assert (mine[b]["live_keys"], mine[b]["forgotten_keys"]) == (1, 0)
    assert not any(n["namespace"].startswith(stem) for n in all_namespaces(other_tenant, limit=1000))

    live = client.get(f"/v1/memory/{a}").json()
    assert live == {"keys": ["diet", "pet"], "next_cursor": None}  # no `forgotten` unless asked for
    every = client.get(f"/v1/memory/{a}", params={"include_forgotten": "true", "limit": 2})
    assert every.status_code == 200
    first = every.json()
    assert first["keys"] == ["city", "diet"] and first["forgotten"] == ["city"] and first["next_cursor"]
    rest = client.get(f"/v1/memory/{a}", params={"include_forgotten": "true", "cursor": first["next_cursor"]}).json()
    assert rest == {"keys": ["pet"], "next_cursor": None, "forgotten": []}
    assert "secret city" not in every.text + client.get("/v1/memory").text
    foreign = other_tenant.get(f"/v1/memory/{a}", params={"include_forgotten": "true"}).json()
    assert foreign["keys"] == [] and foreign["forgotten"] == []


def test_namespace_listing_needs_a_key_and_a_valid_cursor(anon: httpx.Client, client: httpx.Client) -> None:
    problem(anon.get("/v1/memory"), 401)
    problem(client.get("/v1/memory", params={"cursor": "%%%"}), 422)
    problem(client.get("/v1/memory", params={"limit": 0}), 422)
