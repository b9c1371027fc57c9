"""`POST /v1/memory:search` and records with a time to live (`ttl_s`): ranking by Lethe's embedder, LangGraph's filter
semantics, namespace-prefix scoping at label boundaries, live records only, tenant scoping, bad input, and expiry as a
forget (a tombstone, history erased) rather than a record merely hidden."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from app.db.database import Database
from app.memory.cascade import Expiry, NoCascade
from tests.memory.memory_helpers import create, write
from tests.support import problem, sealer_of


def search(client: httpx.Client, **body: Any) -> list[dict[str, Any]]:
    r = client.post("/v1/memory:search", json=body)
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["items"]
    return items


def put(client: httpx.Client, ns: str, key: str, value: Any, **extra: Any) -> dict[str, Any]:
    r = client.put(f"/v1/memory/{ns}/{key}", json={"value": value, **extra}, headers={"If-None-Match": "*"})
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def test_query_ranks_the_relevant_record_first(client: httpx.Client, ns: str) -> None:
    put(client, f"{ns}.pets", "a", {"text": "my dog loves chasing the ball in the park", "n": 1})
    put(client, f"{ns}.food", "b", {"text": "a recipe for lemon cake with sugar and butter", "n": 2})
    put(client, f"{ns}.cars", "c", {"text": "the engine of the truck needs new oil", "n": 3})

    items = search(client, namespace_prefix=ns, query="baking a dessert", fields=["text"])
    assert items[0]["key"] == "b"
    scores = [i["score"] for i in items]
    assert all(isinstance(s, float) for s in scores) and scores == sorted(scores, reverse=True)
    assert items[0]["value"] == {"text": "a recipe for lemon cake with sugar and butter", "n": 2}
    assert items[0]["namespace"] == f"{ns}.food" and items[0]["version"] == 1

    # the whole value as text when no fields are named; a record with no text at the fields follows, unscored
    assert search(client, namespace_prefix=ns, query="puppy playing fetch")[0]["key"] == "a"
    put(client, f"{ns}.cars", "d", {"other": "no text member"})
    ranked = search(client, namespace_prefix=ns, query="truck motor", fields=["text"])
    assert ranked[0]["key"] == "c" and ranked[-1] == {**ranked[-1], "key": "d", "score": None}

    # without a query: newest write first, no scores
    plain = search(client, namespace_prefix=ns)
    assert [i["key"] for i in plain] == ["d", "c", "b", "a"] and {i["score"] for i in plain} == {None}


def test_prefix_stops_at_label_boundaries_and_pages(client: httpx.Client, ns: str) -> None:
    # `-` sorts before `.`: inside the byte range the index scans, left out by the exact test (migration 0028)
    for namespace in (ns, f"{ns}.child", f"{ns}.child.deep", f"{ns}bar", f"{ns}bar.baz", f"{ns}-dash", f"{ns}-d.x"):
        put(client, namespace, "k", {"v": namespace})
    assert {i["namespace"] for i in search(client, namespace_prefix=ns, limit=100)} == {
        ns, f"{ns}.child", f"{ns}.child.deep"
    }
    below = {i["namespace"] for i in search(client, namespace_prefix=f"{ns}.child")}
    assert below == {f"{ns}.child", f"{ns}.child.deep"}
    assert search(client, namespace_prefix=ns[:-1]) == []
    first, second = search(client, namespace_prefix=ns, limit=2), search(client, namespace_prefix=ns, limit=2, offset=2)
    assert len(first) == 2 and len(second) == 1
    assert {i["namespace"] for i in first + second} == {ns, f"{ns}.child", f"{ns}.child.deep"}


def test_filters_follow_langgraph_semantics(client: httpx.Client, ns: str) -> None:
    put(client, ns, "1", {"color": "red", "score": 4.5, "meta": {"a": 1, "b": 2}, "tags": ["x", "y"]})
    put(client, ns, "2", {"color": "red", "score": 3.0, "meta": {"a": 2}, "tags": ["x"]})
    put(client, ns, "3", {"color": "green", "score": 4.0})
    put(client, ns, "4", "not an object")

    def keys(filter: dict[str, Any]) -> set[str]:
        return {i["key"] for i in search(client, namespace_prefix=ns, filter=filter)}

    assert keys({"color": "red"}) == {"1", "2"}
    assert keys({"color": {"$ne": "red"}}) == {"3"}
    assert keys({"score": {"$gt": 3.2}}) == {"1", "3"}
    assert keys({"score": {"$gte": 4.0, "$lt": 4.5}}) == {"3"}
    assert keys({"score": {"$lte": 3}, "color": {"$eq": "red"}}) == {"2"}
    assert keys({"meta": {"a": 1}}) == {"1"}  # an object filter matches member by member
    assert keys({"tags": ["x"]}) == {"2"}  # an array filter matches the whole array
    assert keys({"missing": {"$gt": 0}}) == set()
    assert keys({}) == {"1", "2", "3", "4"}


def test_forgotten_records_are_never_returned(client: httpx.Client, ns: str) -> None:
    create(client, ns, "secret", {"text": "my passport number is 1234"})
    create(client, ns, "kept", {"text": "I like tea"})
    assert client.delete(f"/v1/memory/{ns}/secret").status_code == 200
    for body in ({}, {"query": "passport number"}):
        items = search(client, namespace_prefix=ns, **body)
        assert [i["key"] for i in items] == ["kept"]
        assert "1234" not in str(items)
    assert search(client, namespace_prefix=ns, filter={"text": "my passport number is 1234"}) == []
    # re-established with the tombstone version: the new value only
    assert write(client, ns, "secret", {"text": "renewed"}, base=2).status_code == 200
    assert {i["key"]: i["value"] for i in search(client, namespace_prefix=ns)}["secret"] == {"text": "renewed"}


def test_another_tenant_finds_nothing(client: httpx.Client, other_tenant: httpx.Client, ns: str) -> None:
    put(client, ns, "diet", {"text": "vegan"})
    assert search(other_tenant, namespace_prefix=ns) == []
    assert search(other_tenant, namespace_prefix=ns, query="vegan") == []
    assert ns not in {i["namespace"] for i in search(other_tenant, limit=100)}
    assert [i["key"] for i in search(client, namespace_prefix=ns)] == ["diet"]


@pytest.mark.parametrize(
    "body",
    [
        {"namespace_prefix": "a/b"},
        {"namespace_prefix": "a:b"},
        {"namespace_prefix": "a\nb"},
        {"limit": 0},
        {"limit": 101},
        {"offset": -1},
        {"filter": {"score": {"$regex": "x"}}},
        {"fields": ["a..b"]},
        {"fields": ["a[x]"]},
        {"fields": [""]},
        {"query": 3},
        {"unknown": True},
    ],
)
def test_bad_input_is_422(client: httpx.Client, body: dict[str, Any]) -> None:
    problem(client.post("/v1/memory:search", json=body), 422)


def test_bad_ttl_is_422(client: httpx.Client, ns: str) -> None:
    for ttl in (-1, "soon", 10 * 366 * 24 * 3600):
        r = client.put(f"/v1/memory/{ns}/k", json={"value": 1, "ttl_s": ttl}, headers={"If-None-Match": "*"})
        problem(r, 422)


def test_an_expired_record_is_forgotten_when_read(client: httpx.Client, ns: str) -> None:
    # ttl_s 0 expires at its own write: deterministic, no clock to wait on
    put(client, ns, "brief", {"text": "expires at once"}, ttl_s=0)
    gone = problem(client.get(f"/v1/memory/{ns}/brief"), 404)
    assert gone["forgotten"] is True and gone["version"] == 2
    history = client.get(f"/v1/memory/{ns}/brief/history").json()["versions"]
    assert [(v["op"], v["source"], v["value"], v["erased"]) for v in history] == [
        ("write", "user", None, True), ("forget", "ttl", None, False)
    ]
    # a write based on the version read before it expired is refused, as after any forget
    stale = problem(write(client, ns, "brief", {"text": "late"}, base=1), 412)
    assert stale["forgotten"] is True and stale["current_version"] == 2
    assert write(client, ns, "brief", {"text": "again"}, base=2).status_code == 200


def test_an_expired_record_is_forgotten_by_search_and_hidden_from_listings(client: httpx.Client, ns: str) -> None:
    put(client, ns, "brief", {"text": "expires at once"}, ttl_s=0)
    put(client, ns, "long", {"text": "lives an hour"}, ttl_s=3600)
    assert client.get(f"/v1/memory/{ns}").json()["keys"] == ["long"]
    assert [i["key"] for i in search(client, namespace_prefix=ns, query="expires")] == ["long"]
    assert problem(client.get(f"/v1/memory/{ns}/brief"), 404)["version"] == 2  # the search tombstoned it


def test_a_write_based_on_an_expired_version_learns_of_its_tombstone(client: httpx.Client, ns: str) -> None:
    put(client, ns, "brief", {"text": "expires at once"}, ttl_s=0)
    stale = problem(write(client, ns, "brief", {"text": "late"}, base=1), 412)
    assert stale == {**stale, "forgotten": True, "current_version": 2}


def test_refresh_restarts_the_time_to_live(client: httpx.Client, ns: str) -> None:
    put(client, ns, "k", {"text": "x"}, ttl_s=3600)
    first = client.get(f"/v1/memory/{ns}/k").json()
    plain = client.get(f"/v1/memory/{ns}/k").json()
    assert plain["expires_at"] == first["expires_at"]  # a read without refresh leaves it
    refreshed = client.get(f"/v1/memory/{ns}/k", params={"refresh_ttl": "true"}).json()
    assert refreshed["expires_at"] > first["expires_at"] and refreshed["version"] == first["version"]
    found = search(client, namespace_prefix=ns, refresh_ttl=True)[0]
    assert found["expires_at"] > refreshed["expires_at"]
    assert client.get(f"/v1/memory/{ns}/k").json()["expires_at"] == found["expires_at"]
    # a write without ttl_s never expires
    assert write(client, ns, "k", {"text": "y"}, base=1).status_code == 200
    assert client.get(f"/v1/memory/{ns}/k").json()["expires_at"] is None


def test_the_sweep_forgets_a_record_nobody_reads(
    client: httpx.Client, database_url: str, ns: str, live_server: Any
) -> None:
    put(client, ns, "brief", {"text": "expires at once"}, ttl_s=0)
    put(client, ns, "long", {"text": "lives an hour"}, ttl_s=3600)

    async def sweep() -> int:
        db = Database(database_url, pool_size=1)
        try:
            return await Expiry(db, NoCascade(sealer_of(live_server, db))).sweep()
        finally:
            await db.close()

    asyncio.run(sweep())
    # tombstoned before anything read the key (this sweep, or the server's own if it came first): history shows it
    history = client.get(f"/v1/memory/{ns}/brief/history").json()["versions"]
    assert [(v["op"], v["source"]) for v in history] == [("write", "user"), ("forget", "ttl")]
    assert history[0]["value"] is None
    assert client.get(f"/v1/memory/{ns}/long").status_code == 200
